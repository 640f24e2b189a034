"""The engine side of the vLLM backend (hfdelta._receiver.Receiver), without vLLM: real roots, real LOCALs,
real pulls and locks; the engine's reload is a callback that reads LOCAL's tensors, as vLLM's reload
from disk does, and records what it found. scripts/lab/vllm-backend.sh runs the same Receiver inside a
real vLLM."""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import hfdelta
from hfdelta._receiver import Receiver, version_name, version_number

from vllm_standin import read_weights


class Engine:
    """What the worker holds: a Receiver, and the weights its last reload read from LOCAL."""

    def __init__(self, local: Path) -> None:
        self.local = local
        self.receiver = Receiver(served=str(local))
        self.weights = read_weights(str(local))
        self.reloads: list[dict[str, Any]] = []
        self.fail = 0
        self.barrier: threading.Barrier | None = None

    def reload(self, local: str) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("reload failed")
        # A pull must not be able to take LOCAL's lock while the engine reads it.
        fd = os.open(os.path.join(local, ".weight_sync", "lock"), os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        if self.barrier is not None:  # two workers of one engine reload at the same time
            self.barrier.wait(timeout=60)
        self.weights = read_weights(local)
        self.reloads.append({"local_version": hfdelta.status(local, lock_timeout=0).version})


@pytest.fixture
def root(published: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(published, tmp_path / "root"))


@pytest.fixture
def engine(series: list[Path], tmp_path: Path, root: Path) -> Engine:
    local = tmp_path / "local"
    hfdelta.init(series[0], local, sync=False)
    e = Engine(local)
    e.receiver.init(str(root))
    return e


def wait_staged(r: Receiver) -> dict[str, Any]:
    """The staging's state once its thread is over."""
    s = r._stage  # noqa: SLF001
    if s is not None and s.thread is not None:
        s.thread.join(timeout=120)
    stage: dict[str, Any] = r.state()["stage"]
    assert stage["state"] in ("done", "failed", "deferred"), stage
    return stage


def test_version_names() -> None:
    assert [version_number(x) for x in (3, "3", "000003", "weight_v000003")] == [3, 3, 3, 3]
    assert version_name(12) == "000012"
    for bad in (-1, "v3", "", True, 3.0, None):
        with pytest.raises(hfdelta.UsageError):
            version_number(bad)  # type: ignore[arg-type]


def test_stage_then_update_reloads_exactly_the_version(engine: Engine, series: list[Path]) -> None:
    st = engine.receiver.stage(2, owner="t")
    assert st["stage"]["version"] == "000002"
    stage = wait_staged(engine.receiver)
    assert stage["state"] == "done" and stage["applied"] == ["000001", "000002"]
    assert engine.reloads == [] and engine.weights == read_weights(str(series[0]))  # the pull alone reloads nothing
    assert hfdelta.status(engine.local).version == "000002"
    report = engine.receiver.update(2, engine.reload, owner="t")
    assert report["staged"] and report["applied_in_update"] == [] and report["reload_retried_after"] is None
    assert engine.reloads == [{"local_version": "000002"}]
    assert engine.weights == read_weights(str(series[2]))
    assert engine.receiver.state(owner="t")["serving"] == "000002"
    engine.receiver.release("t")
    assert engine.receiver.state()["claim"] is None


def test_a_version_withdrawn_after_its_stage_is_not_reloaded(engine: Engine, root: Path, series: list[Path]) -> None:
    """What the reload depends on is checked at the reload: a withdrawal between the stage and the update."""
    engine.receiver.stage(2)
    assert wait_staged(engine.receiver)["state"] == "done"
    hfdelta.withdraw(root / "weight_v000002", sync=False)
    with pytest.raises(hfdelta.OutOfOrder, match="version 000002 was withdrawn from .* after .* pulled it"):
        engine.receiver.update(2, engine.reload)
    assert engine.reloads == [] and engine.weights == read_weights(str(series[0]))


def test_update_without_stage_pulls_in_the_update(engine: Engine, series: list[Path]) -> None:
    report = engine.receiver.update("000003", engine.reload)
    assert not report["staged"] and report["applied_in_update"] == ["000001", "000002", "000003"]
    assert engine.weights == read_weights(str(series[3]))


def test_stage_returns_while_the_pull_waits_for_the_lock(engine: Engine) -> None:
    """The stage runs in a thread of its own: held up by LOCAL's lock (a pull on a timer, say), it still
    returns at once, as an engine's scheduling loop needs."""
    fd = os.open(engine.local / ".weight_sync" / "lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        st = engine.receiver.stage(1)
        assert st["stage"]["state"] == "running" and st["local_version"] is None
        assert engine.receiver.stage(1)["stage"]["state"] == "running"  # asked again: the same staging
        with pytest.raises(hfdelta.OutOfOrder, match="staging of version 000001 is under way; refused version 000002"):
            engine.receiver.stage(2)
    finally:
        os.close(fd)
    assert wait_staged(engine.receiver)["state"] == "done"


def test_init_while_pulls_take_and_leave_the_lock(engine: Engine, root: Path) -> None:
    """init looks at LOCAL's state without waiting for its lock. A pull that takes the lock at any moment
    (a second worker's staging, a pull on a timer) must not make init fail: held throughout, or taken and
    left as fast as a thread can, between any two steps of init's own look."""
    lock = engine.local / ".weight_sync" / "lock"
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert engine.receiver.init(str(root))["local_version"] is None
    finally:
        os.close(fd)
    stop = threading.Event()

    def pulls() -> None:
        fd = os.open(lock, os.O_RDONLY)
        try:
            while not stop.is_set():
                fcntl.flock(fd, fcntl.LOCK_EX)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    t = threading.Thread(target=pulls)
    t.start()
    try:
        for _ in range(300):
            engine.receiver.init(str(root))
    finally:
        stop.set()
        t.join()


def test_two_workers_on_one_host_pull_once_and_reload_together(series: list[Path], root: Path,
                                                              tmp_path: Path) -> None:
    local = tmp_path / "local"
    hfdelta.init(series[0], local, sync=False)
    workers = [Engine(local), Engine(local)]
    barrier = threading.Barrier(2)
    for w in workers:
        w.receiver.init(str(root))
        w.barrier = barrier
        w.receiver.stage(4)
    stages = [wait_staged(w.receiver) for w in workers]
    assert sorted(len(s["applied"]) for s in stages) == [0, 4]  # one pulled, the other found LOCAL at 4
    threads = [threading.Thread(target=w.receiver.update, args=(4, w.reload)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not barrier.broken  # both reloads held the shared lock at once
    assert all(w.weights == read_weights(str(series[4])) for w in workers)


@pytest.mark.parametrize("case", ["missing", "withdrawn", "newer", "damaged"])
def test_bad_versions_fail_before_any_reload(engine: Engine, root: Path, series: list[Path], case: str) -> None:
    want = {"missing": 9, "withdrawn": 3, "newer": 1, "damaged": 3}[case]
    if case == "withdrawn":
        hfdelta.withdraw(root / "weight_v000003", sync=False)
    if case == "newer":
        hfdelta.pull(root, engine.local, target=2, sync=False)
    if case == "damaged":
        hfdelta.pull(root, engine.local, target=2, sync=False)
        f = next(p for p in sorted((root / "weight_v000003").iterdir()) if p.suffix == ".safetensors")
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    before = hfdelta.status(engine.local).version
    engine.receiver.stage(want)
    stage = wait_staged(engine.receiver)
    assert stage["state"] == "failed"
    message = {"missing": "version 000009 is not published", "withdrawn": "000003 is not published (it was withdrawn)",
               "newer": "is at version 000002, newer than the target 000001", "damaged": "000003"}[case]
    assert message in stage["error"] and f"LOCAL keeps version {before}" in stage["error"]
    with pytest.raises(hfdelta.HfdeltaError, match="the engine keeps serving the weights it holds"):
        engine.receiver.update(want, engine.reload)
    assert engine.reloads == []
    st = hfdelta.verify(engine.local)
    assert st.state == "clean" and st.version == before


def test_a_pruned_range_falls_back_to_a_full_version(engine: Engine, root: Path, series: list[Path],
                                                    tmp_path: Path) -> None:
    hfdelta.pull(root, engine.local, target=1, sync=False)
    saves = tmp_path / "more"
    shutil.copytree(series[4], saves / "s5")
    hfdelta.publish_full(saves / "s5", root, base=series[4], sync=False)  # version 5, full, delta beside it
    hfdelta.prune(root, sync=False)  # keeps only from the full version 5
    assert not (root / "weight_v000002").exists()
    engine.receiver.stage(5)
    stage = wait_staged(engine.receiver)
    assert stage["state"] == "done" and stage["fallback"], stage
    engine.receiver.update(5, engine.reload)
    assert engine.weights == read_weights(str(series[4]))


def test_a_root_that_is_not_there(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(hfdelta.BadInput, match="is not a directory on this host"):
        engine.receiver.init(str(tmp_path / "no-such-root"))
    r = Receiver(served=str(engine.local))
    with pytest.raises(hfdelta.UsageError, match="init_weight_transfer_engine"):
        r.stage(1)
    with pytest.raises(hfdelta.BadInput, match="not an hfdelta LOCAL"):
        Receiver(served=str(tmp_path)).init(str(engine.local.parent / "root"))


def test_a_second_caller_is_refused_while_the_first_holds_the_engine(engine: Engine) -> None:
    engine.receiver.stage(2, owner="trainer-a")
    wait_staged(engine.receiver)
    with pytest.raises(hfdelta.OutOfOrder, match=r"brought to version 000002 by another caller \(trainer-a"):
        engine.receiver.stage(3, owner="trainer-b")
    with pytest.raises(hfdelta.OutOfOrder, match="refused version 000003"):
        engine.receiver.update(3, engine.reload, owner="trainer-b")
    with pytest.raises(hfdelta.OutOfOrder):
        engine.receiver.update(3, engine.reload)  # a caller without a claim too
    (engine.local.parent / "other-root").mkdir()
    with pytest.raises(hfdelta.UsageError, match="claimed by a caller"):
        engine.receiver.init(str(engine.local.parent / "other-root"))  # B pointing the engine elsewhere
    engine.receiver.update(2, engine.reload, owner="trainer-a")
    engine.receiver.release("trainer-a")
    engine.receiver.stage(3, owner="trainer-b")
    assert wait_staged(engine.receiver)["state"] == "done"


def test_a_claim_left_behind_expires(engine: Engine) -> None:
    r = engine.receiver
    r._claim_timeout = 0.0  # noqa: SLF001 (a caller that died without releasing, long ago)
    r.stage(1, owner="gone")
    wait_staged(r)
    r.stage(2, owner="next")
    assert wait_staged(r)["state"] == "done" and r.state()["claim"]["owner"] == "next"


def test_a_failed_reload_is_tried_again(engine: Engine, series: list[Path]) -> None:
    engine.fail = 1
    report = engine.receiver.update(1, engine.reload)
    assert report["reload_retried_after"] == "reload failed"
    assert engine.weights == read_weights(str(series[1]))
    engine.fail = 2
    with pytest.raises(hfdelta.HfdeltaError, match="failed twice .* restart the engine on LOCAL"):
        engine.receiver.update(2, engine.reload)


def test_a_mapped_local_defers_the_pull_to_the_update(engine: Engine, series: list[Path]) -> None:
    """An engine that kept LOCAL's files mapped would see a pull patch its weights as it serves: then the
    stage leaves the pull to the update, inside the pause."""
    f = next(p for p in sorted(engine.local.iterdir()) if p.suffix == ".safetensors")
    with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ):
        assert str(f) in engine.receiver.state()["mapped"]
        st = engine.receiver.stage(1)
        assert st["stage"]["state"] == "deferred" and "mapped" in st["stage"]["deferred"]
        assert hfdelta.status(engine.local).version == "000000"
        report = engine.receiver.update(1, engine.reload)
    assert report["applied_in_update"] == ["000001"]
    assert engine.weights == read_weights(str(series[1]))
