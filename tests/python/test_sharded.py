"""hfdelta.ShardedPublisher with real processes and real torch.distributed (gloo on the CPU):
4 ranks as 2 hosts x 2 ranks, each host with its own mirror (docs/sharded.md).

Every published version is checked the way hosts use it: a fresh host pulling the root lands byte
for byte on the gathered tensors (written by rank 0 for the test only), the mirrors too, and the
result equals what ``delta-diff`` of the gathered save gives a host. Skipped, saying why, where
torch (or, for FSDP2, transformers) is not installed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

import hfdelta

torch = pytest.importorskip("torch", reason="torch is not installed: the sharded publisher's tests need "
                                            "torch.distributed (scripts/ci/python-test.sh installs it)")
from safetensors.numpy import load_file, save_file  # noqa: E402
from safetensors.torch import load_file as load_torch  # noqa: E402

WORKER = str(Path(__file__).with_name("sharded_worker.py"))
WORLD = 4


def base_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)

    def t(shape: tuple[int, ...], dtype: Any = np.float16) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    return {
        "model.embed.weight": t((37, 24)),          # rows, uneven over 4 ranks
        "model.layers.0.q_proj.weight": t((24, 30)),  # columns
        "model.layers.0.o_proj.weight": t((30, 24)),  # rows
        "model.layers.0.experts.weight": t((4, 10, 6), np.float32),  # 3-D, its second dimension split
        "model.layers.0.grid.weight": t((20, 18)),  # 2 x 2 grid
        "model.layers.0.input_layernorm.weight": t((24,), np.float32),  # replicated
        "model.norm.weight": t((24,), np.float32),  # replicated
        "model.layers.0.mlp.weight": t((24, 48)),   # pipeline: whole on one rank
        "model.layers.1.mlp.weight": t((48, 24)),
        "lm_head.weight": t((37, 24)),
        "model.scale": np.array(1.5, dtype=np.float32),  # 0-D, whole
    }


def make_world(tmp: Path, save: Optional[Path] = None) -> Path:
    """WORKDIR: base (a checkpoint), root, mirror-a and mirror-b initialised from base."""
    work = tmp / "work"
    (work / "root").mkdir(parents=True)
    if save is None:
        base = work / "base"
        base.mkdir()
        save_file(base_tensors(), str(base / "model.safetensors"))
        (base / "config.json").write_text(json.dumps({"model_type": "test"}))
    else:
        shutil.copytree(save, work / "base")
    for host in ("a", "b"):
        hfdelta.init(work / "base", work / f"mirror-{host}", sync=False)
    return work


def run_ranks(work: Path, scenario: str, versions: int = 1, world: int = WORLD,
              env_of: Optional[dict[int, dict[str, str]]] = None, kill_after: Optional[tuple[int, float]] = None,
              timeout: float = 300) -> list[dict[str, Any]]:
    """Starts WORLD ranks, waits for them (killing one after a delay if asked), returns their results."""
    for f in work.glob("result-*.json"):
        f.unlink()
    (work / "pg").unlink(missing_ok=True)
    procs = []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", **(env_of or {}).get(r, {}))
        procs.append(subprocess.Popen([sys.executable, WORKER, scenario, str(work), str(r), str(world),
                                       str(versions)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    start = time.monotonic()
    deadline, torn_down = start + timeout, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if kill_after is not None and now - start >= kill_after[1] and procs[kill_after[0]].poll() is None:
            procs[kill_after[0]].send_signal(signal.SIGKILL)
            kill_after = None
        # As a launcher (torchrun) does: once a rank is killed, the job's other ranks are torn down
        # (SIGKILL, wherever they are) a moment later, instead of waiting out the collectives' timeout.
        if torn_down is None and any(p.returncode == -signal.SIGKILL for p in procs):
            torn_down = now + 2.0
        if (torn_down is not None and now >= torn_down) or now >= deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    logs = [p.communicate()[0].decode(errors="replace") for p in procs]
    results = []
    for r in range(world):
        f = work / f"result-{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else {"rank": r, "killed": True, "log": logs[r]})
    return results


def tensors_of(d: Path) -> dict[str, bytes]:
    """Every tensor's bytes (torch reads bfloat16, which numpy has no type for)."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        for name, t in load_torch(str(f)).items():
            out[name] = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return out


def gathered(work: Path, v: int) -> dict[str, bytes]:
    """The gathered tensors of version v, as rank 0 saved them; for the generated layouts, computed again
    where rank 0 was torn down before it could save them (a version a killed job still committed)."""
    d = work / f"gathered-v{v}"
    if not d.exists():
        sys.path.insert(0, str(Path(WORKER).parent))
        from sharded_worker import expected
        d.mkdir()
        save_file(expected(load_file(str(work / "base" / "model.safetensors")), v), str(d / "model.safetensors"))
    return tensors_of(d)


def host_at(work: Path, tmp: Path, v: int, name: str) -> Path:
    """A fresh host: LOCAL from the base, pulled from the root to version v."""
    local = tmp / name
    hfdelta.init(work / "base", local, sync=False)
    hfdelta.pull(work / "root", local, target=v, sync=False)
    return local


def check_versions(work: Path, tmp: Path, versions: list[int]) -> None:
    for v in versions:
        local = host_at(work, tmp, v, f"host-v{v}")
        assert tensors_of(local) == gathered(work, v), f"a host at version {v} holds other bytes than the gather"
        assert hfdelta.verify(local).ok
    newest = versions[-1]
    for host in ("a", "b"):
        assert tensors_of(work / f"mirror-{host}") == gathered(work, newest)
        assert hfdelta.status(work / f"mirror-{host}").version == f"{newest:06d}"


def delta_diff_lands_the_same(work: Path, tmp: Path, v: int) -> None:
    """delta-diff of the gathered saves, applied to a host, gives the bytes the sharded version gave."""
    prev = work / "base" if v == 1 else work / f"gathered-v{v - 1}"
    new = work / f"gathered-v{v}"
    for d in (prev, new):
        if not (d / "config.json").exists():
            shutil.copy(work / "base" / "config.json", d / "config.json")
    local = tmp / f"dd-host-v{v}"
    hfdelta.init(prev, local, version=v - 1, sync=False)
    d = hfdelta.diff(prev, new, tmp / f"dd-v{v}", delta_version=v, base_version=v - 1, sync=False)
    hfdelta.apply(tmp / f"dd-v{v}", local, sync=False)
    assert tensors_of(local) == tensors_of(host_at(work, tmp, v, f"sh-host-v{v}"))
    # the ranks' parts count the changed elements as delta-diff does (the fleet view's density)
    index = json.loads((work / "root" / f"weight_v{v:06d}" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["hfdelta_elements"] == {"changed": d.elements_changed, "total": d.elements}


def ok(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in results:
        assert "error" not in r and "killed" not in r, r
    return results


@pytest.mark.parametrize("encoding", ["sparse", "context"])
def test_tensor_parallel_and_pipeline_layouts(tmp_path: Path, encoding: str, monkeypatch: Any) -> None:
    work = make_world(tmp_path)
    monkeypatch.setenv("SHARD_ENCODING", encoding)
    results = ok(run_ranks(work, "tp", versions=2))
    for v in (1, 2):
        outs = {r["results"][v - 1]["out"] for r in results}
        assert outs == {str(work / "root" / f"weight_v{v:06d}")}
    # each rank read only its own ranges of its mirror: the four together read each mirror tensor once
    # per version, a replicated piece once
    total = sum(os.path.getsize(f) for f in (work / "base").glob("*.safetensors"))
    read = sum(r["results"][0]["mirror_bytes_read"] for r in results)
    assert read < total
    assert {r["results"][0]["pieces_kept"] for r in results if r["rank"] > 0} != set()
    check_versions(work, tmp_path, [1, 2])
    delta_diff_lands_the_same(work, tmp_path, 1)
    delta_diff_lands_the_same(work, tmp_path, 2)
    inspected = hfdelta.inspect(work / "root" / "weight_v000001")
    assert inspected.format == 6
    assert {t["encoding"] for t in inspected.tensors} == {"parts"}


@pytest.mark.parametrize("scenario,cls", [("gap", "UsageError"), ("overlap", "UsageError"),
                                          ("dtype", "Unsupported")])
def test_a_wrong_piece_fails_every_rank(tmp_path: Path, scenario: str, cls: str) -> None:
    work = make_world(tmp_path)
    before = sorted(p.name for p in (work / "root").iterdir())
    results = run_ranks(work, scenario)
    errors = [r.get("error") for r in results]
    assert all(e is not None for e in errors), results
    assert {e["class"] for e in errors} == {cls}, errors
    assert len({e["message"] for e in errors}) == 1, "every rank raises the same error"
    assert "nothing was published" in errors[0]["message"]
    assert sorted(p.name for p in (work / "root").iterdir()) == before
    for host in ("a", "b"):
        assert hfdelta.status(work / f"mirror-{host}").version == "000000"
    # the next call, with the right pieces, publishes version 1
    ok(run_ranks(work, "tp"))
    check_versions(work, tmp_path, [1])


def test_mirrors_that_disagree_are_refused(tmp_path: Path) -> None:
    work = make_world(tmp_path)
    ok(run_ranks(work, "tp"))
    # host b's mirror re-created at an older checkpoint but the same number: refused on every rank
    shutil.rmtree(work / "mirror-b")
    hfdelta.init(work / "base", work / "mirror-b", version=1, sync=False)
    results = run_ranks(work, "tp")
    assert {r["error"]["class"] for r in results} == {"OutOfOrder"}, results
    assert "mirrors disagree" in results[0]["error"]["message"]
    assert not (work / "root" / "weight_v000002").exists()


def kill_trial(work: Path, tmp: Path, rank: int, step: Optional[int], delay: Optional[float]) -> None:
    env = {rank: {"HFDELTA_FAULT_AT": str(step)}} if step is not None else None
    killed = run_ranks(work, "tp", env_of=env, kill_after=(rank, delay) if delay is not None else None)
    versions_before = [p.name for p in sorted((work / "root").glob("weight_v*"))]
    # every rank restarted: whatever the kill left, the next version lands exactly
    after = ok(run_ranks(work, "tp"))
    v = after[0]["results"][0]["version"]
    names = [p.name for p in sorted((work / "root").glob("weight_v*"))]
    assert names == [f"weight_v{i:06d}" for i in range(1, v + 1)], (names, versions_before, killed)
    check_versions(work, tmp, [v])  # a fresh host pulls every version in turn to reach it


def test_a_rank_killed_at_write_steps_and_at_random(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HFDELTA_KILL_SEED", "29")))
    work = make_world(tmp_path)
    # write steps spread over a version: rank 0 (stage, its parts, the commit, host a's advance),
    # rank 1 (its parts only), rank 2 (host b's leader: its parts and the advance)
    # (HFDELTA_SHARDED_KILLS=all: every trial below; by default, as CI runs it, every other one and one
    # random instant, to keep CI's time)
    trials = [(0, 1), (0, 4), (0, 9), (0, 16), (0, 30), (1, 2), (2, 3), (2, 12)]
    full = os.environ.get("HFDELTA_SHARDED_KILLS") == "all"
    if not full:
        trials = trials[::2] + [(2, 12)]
    for i, (rank, step) in enumerate(trials):
        kill_trial(work, tmp_path / f"t{i}", rank, step, None)
    for i in range(2 if full else 1):  # random instants
        kill_trial(work, tmp_path / f"r{i}", rng.randrange(WORLD), None, rng.uniform(2.0, 6.0))


def test_fsdp2_fully_shard_of_a_qwen3_model(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: the FSDP2 test "
                                                              "shards a transformers Qwen3 model")
    cfg = transformers.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=False, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    save = tmp_path / "save"
    model.save_pretrained(save, safe_serialization=True)
    work = make_world(tmp_path, save)
    results = ok(run_ranks(work, "fsdp2", versions=2))
    assert results[0]["results"][1]["version"] == 2
    # FSDP2 shards every parameter by rows over the 4 ranks: each read about a quarter of its mirror
    total = sum(os.path.getsize(f) for f in (work / "base").glob("*.safetensors"))
    for r in results:
        assert r["results"][0]["mirror_bytes_read"] < total / 2
    check_versions(work, tmp_path, [1, 2])
    delta_diff_lands_the_same(work, tmp_path, 1)


def test_pieces_written_during_publish_give_versions_every_host_applies(tmp_path: Path) -> None:
    """A trainer thread on every rank writes into the rank's pieces all through publish(): each rank reads
    each byte once, so every version is whole (each part's checksum of the bytes it gives), both mirrors
    advance, and a host pulls every version."""
    save = tmp_path / "save"
    save.mkdir()
    rng = np.random.default_rng(3)
    big = rng.standard_normal((4096, 8192), dtype=np.float32).astype(np.float16)  # 64 MiB: many chunks a rank
    save_file({"model.big.weight": big, "model.norm.weight": big[0].copy()}, str(save / "model.safetensors"))
    (save / "config.json").write_text(json.dumps({"model_type": "test"}))
    work = make_world(tmp_path, save)
    results = ok(run_ranks(work, "live", versions=2, world=2))
    assert [[v["version"] for v in r["results"]] for r in results] == [[1, 2], [1, 2]]
    for host in ("a", "b"):
        assert hfdelta.status(work / f"mirror-{host}").version == "000002"
    local = host_at(work, tmp_path, 2, "host")
    assert hfdelta.verify(local).ok
    assert tensors_of(local) == tensors_of(work / "mirror-a") == tensors_of(work / "mirror-b")


def test_two_jobs_never_publish_one_number_twice(tmp_path: Path) -> None:
    """Two trainers (or a stale restart) that both staged version 1 on base 0: one commit wins, the
    other raises Exists and leaves nothing; no lock between them is needed (the rename refuses)."""
    from hfdelta import _core

    work = make_world(tmp_path)
    base = load_file(str(work / "base" / "model.safetensors"))
    stages = [_core._make_shard_stage(str(work / "root"), 1) for _ in range(2)]
    texts = []
    for k, stage in enumerate(stages):
        w = _core._ShardWriter(str(work / "mirror-a"), stage, 0, "sparse", 3)
        for name, t in base.items():
            new = t.copy()
            new.reshape(-1)[0] += k + 1  # each job publishes other bytes
            rows = t.shape[0] if t.shape else 1
            cols = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
            dtype = {"float16": "F16", "float32": "F32"}[t.dtype.name]
            w.put(name, new.reshape(-1).view(np.uint8), dtype, list(t.shape), 0, rows, 0, cols)
        texts.append(w.finish(False))
        w.close()
    _core._commit_sharded(str(work / "root"), str(work / "mirror-a"), stages[0], 1, 0, texts[0], False)
    with pytest.raises(hfdelta.Exists):
        _core._commit_sharded(str(work / "root"), str(work / "mirror-a"), stages[1], 1, 0, texts[1], False)
    assert [p.name for p in (work / "root").glob("weight_v*")] == ["weight_v000001"]
    host = host_at(work, tmp_path, 1, "host")
    assert hfdelta.verify(host).ok


def test_a_publisher_that_lost_the_race_is_told_and_recovers_by_reopening(tmp_path: Path) -> None:
    """Another writer publishes version 1 while the ranks write theirs: every rank raises Exists naming
    that version and when it appeared, nothing of theirs is published, and reopening the publisher (no
    restart of any rank) publishes version 2 on the other's version 1."""
    work = make_world(tmp_path)
    results = ok(run_ranks(work, "race"))
    for r in results:
        race = r["results"][0]
        assert race["lost"] is not None, r
        assert "weight_v000001" in race["lost"] and "another publisher" in race["lost"], race["lost"]
        assert " UTC, " in race["lost"] and "opened again" in race["lost"], race["lost"]
        assert race["reopened_at"] == 1
        assert race["published"]["version"] == 2
    assert sorted(p.name for p in (work / "root").iterdir() if not p.name.startswith(".")) == [
        "weight_v000001", "weight_v000002"]
    check_versions(work, tmp_path, [2])
