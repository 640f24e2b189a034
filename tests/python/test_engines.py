"""The trainer's client, hfdelta.engines.Engines, against stand-ins for vLLM servers running the hfdelta
backend (vllm_standin.py: vLLM's HTTP routes and model stood in for, the hfdelta side real: each
stand-in's Receiver pulls into its own LOCAL and reloads from it). What is checked here is the client's
order of calls, that an engine it paused is always resumed, and what it reports; the same client
against a real vLLM is scripts/lab/vllm-backend.sh."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest

import hfdelta
from hfdelta.engines import EngineResult, Engines, EngineUpdateError

from vllm_standin import StandIn, served_equals


@pytest.fixture
def root(published: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(published, tmp_path / "root"))


@pytest.fixture
def standins(series: list[Path], tmp_path: Path) -> Iterator[list[StandIn]]:
    """Two engines, each on a LOCAL of its own at version 0."""
    out = []
    for i in range(2):
        local = tmp_path / f"local{i}"
        hfdelta.init(series[0], local, sync=False)
        out.append(StandIn(str(local)))
    yield out
    for s in out:
        s.close()


SWAP = ["POST /pause?mode=wait", "POST /start_weight_update", "POST /update_weights", "POST /finish_weight_update",
        "POST /reset_prefix_cache", "POST /resume"]


FULL = (["GET /weight_info", "POST /init_weight_transfer_engine", "POST /collective_rpc hfdelta_stage"] + SWAP
        + ["GET /weight_info", "POST /collective_rpc hfdelta_state", "POST /collective_rpc hfdelta_release"])


def seq(s: StandIn) -> list[str]:
    """The stand-in's requests, less the polls of the stage before the pause."""
    out = s.requests()
    cut = next((i for i, x in enumerate(out) if x.startswith("POST /pause")), len(out))
    return [x for x in out[:cut] if x != "POST /collective_rpc hfdelta_state"] + out[cut:]


def pause_spans(s: StandIn) -> list[tuple[float, float]]:
    spans, start = [], None
    for e in s.log:
        if e["path"].startswith("/pause"):
            start = e["t"]
        elif e["path"] == "/resume" and start is not None:
            spans.append((start, e["t"]))
            start = None
    return spans


def test_all_engines_staged_then_swapped(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    lines: list[str] = []
    engines = Engines([s.url for s in standins], root=root, log=lines.append)
    for v in (1, 2):
        results = engines.update(v)
        assert [r.url for r in results] == [s.url for s in standins]
        for r, s in zip(results, standins):
            assert r.ok and not r.skipped and r.resumed and r.served_after == f"{v:06d}", r
            assert r.applied == [f"{v:06d}"] and r.stage_seconds is not None and r.pause_seconds is not None
            assert r.reload_seconds is not None and r.error is None
            assert seq(s) == FULL, s.requests()
            assert served_equals(s, str(series[v]))
            assert s.reloads[-1] == {"paused": True, "local_version": f"{v:06d}", "state": "clean"}
            assert s.receiver.state()["claim"] is None  # released
            s.log.clear()
    # Every engine staged before any was paused.
    assert lines.index(next(x for x in lines if "paused for" in x)) >= 2
    assert all("staged version" in x for x in lines[:2])


def test_rolling_pauses_one_engine_at_a_time(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    Engines([s.url for s in standins], root=root).update(3, rolling=True)
    (a0, a1), = pause_spans(standins[0])
    (b0, b1), = pause_spans(standins[1])
    assert a1 < b0  # the first resumed before the second was paused
    stage_b = next(e["t"] for e in standins[1].log if e.get("rpc") == "hfdelta_stage")
    assert stage_b < a0  # both staged before the first pause
    assert all(served_equals(s, str(series[3])) for s in standins)


def test_an_engine_serving_the_version_is_left_alone(standins: list[StandIn], root: Path) -> None:
    engines = Engines([standins[0].url], root=root)
    engines.update(1)
    standins[0].log.clear()
    (r,) = engines.update("000001")
    assert r.ok and r.skipped and r.pause_seconds is None
    assert standins[0].requests() == ["GET /weight_info"]


def test_an_engine_serving_a_newer_version_is_refused_untouched(standins: list[StandIn], root: Path) -> None:
    a, b = standins
    Engines([a.url], root=root).update(2)
    a.log.clear()
    with pytest.raises(EngineUpdateError) as ei:
        Engines([a.url, b.url], root=root).update(1)
    e = ei.value
    assert list(e.failed) == [a.url] and "serves version 000002, newer than 000001" in e.failed[a.url]
    assert e.failed[a.url].startswith("weight_info: ")
    assert a.requests() == ["GET /weight_info"] and a.version == "000002"
    ok = [r for r in e.results if r.ok]
    assert [r.url for r in ok] == [b.url] and b.version == "000001"  # the other engine went on


def test_a_failed_stage_never_pauses_that_engine(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    a, b = standins
    hfdelta.pull(root, a.local, target=3, sync=False)  # a's LOCAL moved ahead by a puller on a timer
    with pytest.raises(EngineUpdateError) as ei:
        Engines([a.url, b.url], root=root).update(2)
    why = ei.value.failed[a.url]
    assert why.startswith("stage: ") and "is at version 000003, newer than the target 000002" in why
    assert not any(x.startswith("POST /pause") for x in a.requests())
    assert a.version == "default" and served_equals(a, str(series[0]))
    assert a.receiver.state()["claim"] is None
    assert b.version == "000002" and served_equals(b, str(series[2]))
    assert "version 000002 is not served by 1 of 2 engine(s)" in str(ei.value)


@pytest.mark.parametrize("case", ["missing", "withdrawn", "damaged", "root"])
def test_bad_input_is_an_error_naming_the_engine(standins: list[StandIn], root: Path, series: list[Path],
                                                 tmp_path: Path, case: str) -> None:
    a = standins[0]
    version, want = {"missing": (7, "version 000007 is not published"),
                     "withdrawn": (2, "000002 is not published (it was withdrawn)"),
                     "damaged": (1, "weight_v000001/model-00000-of-00001.safetensors: "),  # the damaged file named
                     "root": (1, "is not a directory on this host")}[case]
    where = root
    if case == "withdrawn":
        hfdelta.withdraw(root / "weight_v000002", sync=False)
    if case == "damaged":
        f = next(p for p in sorted((root / "weight_v000001").iterdir()) if p.suffix == ".safetensors")
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    if case == "root":
        where = tmp_path / "unmounted"
    with pytest.raises(EngineUpdateError) as ei:
        Engines([a.url], root=where).update(version)
    assert want in ei.value.failed[a.url], ei.value.failed
    assert not any(x.startswith("POST /pause") for x in a.requests())
    assert hfdelta.verify(a.local).version == "000000" and a.version == "default"
    assert served_equals(a, str(series[0]))


def test_a_failed_update_still_resumes_the_engine(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    a, b = standins
    a.reload_failures = 2  # the reload fails, and fails again
    with pytest.raises(EngineUpdateError) as ei:
        Engines([a.url, b.url], root=root).update(1)
    why = ei.value.failed[a.url]
    assert why.startswith("update_weights: ") and "restart the engine on LOCAL" in why
    ra = next(r for r in ei.value.results if r.url == a.url)
    assert ra.resumed is True and ra.pause_seconds is not None
    assert seq(a)[3:8] == ["POST /pause?mode=wait", "POST /start_weight_update", "POST /update_weights",
                           "POST /resume", "POST /collective_rpc hfdelta_release"]
    assert not a.paused and a.version == "default"
    assert b.version == "000001" and not b.paused


def test_a_reload_that_fails_once_is_retried(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    a = standins[0]
    a.reload_failures = 1
    (r,) = Engines([a.url], root=root).update(1)
    assert r.ok and served_equals(a, str(series[1]))
    assert a.receiver.state()["last_update"]["reload_retried_after"] == "stand-in reload failure"


def test_an_unreachable_engine_is_named(standins: list[StandIn], root: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
    try:
        with pytest.raises(EngineUpdateError) as ei:
            Engines([dead, standins[0].url], root=root, timeout=5).update(1)
    finally:
        s.close()
    assert list(ei.value.failed) == [dead] and "GET /weight_info: no answer" in ei.value.failed[dead]
    assert standins[0].version == "000001"


def test_an_engine_without_the_rl_routes(standins: list[StandIn], root: Path) -> None:
    standins[0].dev_mode = False
    with pytest.raises(EngineUpdateError) as ei:
        Engines([standins[0].url], root=root).update(1)
    assert "HTTP 404" in str(ei.value) and "VLLM_SERVER_DEV_MODE=1" in str(ei.value)


def test_two_trainers_on_one_engine(standins: list[StandIn], root: Path, series: list[Path]) -> None:
    """Trainer A's stage is held up (LOCAL's lock taken by a pull on a timer); trainer B, asking for
    another version meanwhile, is refused with what A is doing; A then finishes."""
    a = standins[0]
    fd = os.open(Path(a.local) / ".weight_sync" / "lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    out: dict[str, object] = {}

    def trainer_a() -> None:
        try:
            out["a"] = Engines([a.url], root=root).update(2)
        except Exception as e:  # reported below
            out["a"] = e

    t = threading.Thread(target=trainer_a)
    t.start()
    try:
        for _ in range(600):  # until A's stage is under way
            if any(e.get("rpc") == "hfdelta_stage" for e in a.log):
                break
            threading.Event().wait(0.05)
        with pytest.raises(EngineUpdateError) as ei:
            Engines([a.url], root=root).update(3)
        why = ei.value.failed[a.url]
        assert why.startswith("stage: ") and "being brought to version 000002 by another caller" in why, why
    finally:
        os.close(fd)
        t.join(timeout=120)
    results = out["a"]
    assert isinstance(results, list) and isinstance(results[0], EngineResult) and results[0].ok, results
    assert a.version == "000002" and served_equals(a, str(series[2]))
    assert len(pause_spans(a)) == 1  # B never paused it


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no engine URL"):
        Engines([], root="/r")
    with pytest.raises(ValueError, match="not an http"):
        Engines(["127.0.0.1:8000"], root="/r")
    with pytest.raises(ValueError, match="pause_mode"):
        Engines(["http://h:1"], root="/r", pause_mode="drop")
    with pytest.raises(hfdelta.UsageError):
        Engines(["http://h:1"], root="/r").update(-1)
