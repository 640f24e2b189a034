"""Publishing from memory against saving and diffing, side by side in one run
(scripts/bench/bench.sh runs it; see there for the setup).

One generated pair of saves (SERIES/save_000, save_001) is loaded into memory;
each repetition publishes one version, alternating the two saves' tensors (so
every version is a real step of the series' density, forwards or backwards),
three ways:
  memory      hfdelta.Publisher.publish() of the tensors in memory, against a
              mirror; "memory" is the time until the version is published and
              durable, "memory+mirror" until the mirror has been advanced too
              (the Publisher does that in the background while the trainer
              goes on);
  save+diff   safetensors.numpy.save_file of the tensors in the save's shard
              layout, then delta-diff PREVIOUS SAVED OUT;
  diff        delta-diff alone, on the two saves already in the page cache.
Each figure is the median over the repetitions. The delta of version 1
published from memory is checked to be delta-diff's, byte for byte (the
safetensors library lays its save out its own way, with its own header, so
save+diff writes a delta that also rewrites the headers).

Usage: bench_publish.py SERIES WORK DELTA_DIFF OUT_JSON [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy loader)
from safetensors.numpy import load_file, save_file

import hfdelta


def load(save: Path) -> list[tuple[str, dict[str, Any]]]:
    """(shard file name, its tensors) of a save, in file order."""
    return [(f.name, load_file(str(f))) for f in sorted(save.glob("*.safetensors"))]


def read_all(d: Path) -> None:
    """Reads every file once, so that it is in the page cache."""
    for f in sorted(d.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def files_of(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_publish: {' '.join(cmd)} failed ({r.returncode}): {r.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("series", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("delta_diff")
    ap.add_argument("out_json", type=Path)
    ap.add_argument("--repeat", type=int, default=4)
    a = ap.parse_args()
    saves = [a.series / "save_000", a.series / "save_001"]
    work = a.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shards = [load(s) for s in saves]  # both saves in memory: ~2.4 GB for qwen3-0.6b
    others = [f for f in saves[0].iterdir() if f.is_file() and not f.name.endswith(".safetensors")]
    root, mirror, saved, outs = work / "root", work / "mirror", work / "saved", work / "outs"
    root.mkdir()
    outs.mkdir()
    hfdelta.init(saves[0], mirror)
    for s in saves:
        read_all(s)
    t: dict[str, list[float]] = {"memory": [], "memory+mirror": [], "save+diff": [], "save": [], "diff": []}
    first: dict[str, Path] = {}
    with hfdelta.Publisher(root, mirror) as pub:
        for rep in range(a.repeat):
            cur, prev = (rep + 1) % 2, rep % 2  # version rep+1 holds save `cur`'s tensors
            # memory
            items = [(n, x) for _, ts in shards[cur] for n, x in ts.items()]
            t0 = time.perf_counter()
            r = pub.publish(items)
            t1 = time.perf_counter()
            pub.wait()
            t2 = time.perf_counter()
            t["memory"].append(t1 - t0)
            t["memory+mirror"].append(t2 - t0)
            first.setdefault("memory", Path(r.out))
            # save + diff
            shutil.rmtree(saved, ignore_errors=True)
            saved.mkdir()
            for f in others:
                shutil.copy2(f, saved / f.name)
            t0 = time.perf_counter()
            for name, ts in shards[cur]:
                save_file(ts, str(saved / name))
            t1 = time.perf_counter()
            out = outs / f"saved-{rep}"
            run([a.delta_diff, "-q", "--delta-version", "1", str(saves[prev]), str(saved), str(out)])
            t2 = time.perf_counter()
            t["save"].append(t1 - t0)
            t["save+diff"].append(t2 - t0)
            first.setdefault("save+diff", out)
            # delta-diff alone, inputs in the page cache
            out = outs / f"diff-{rep}"
            t0 = time.perf_counter()
            run([a.delta_diff, "-q", "--delta-version", "1", str(saves[prev]), str(saves[cur]), str(out)])
            t["diff"].append(time.perf_counter() - t0)
            first.setdefault("diff", out)
            if rep == 0 and files_of(first["memory"]) != files_of(first["diff"]):
                raise SystemExit("bench_publish: the delta published from memory differs from delta-diff's")
            for p in outs.iterdir():
                shutil.rmtree(p)
    med = {k: statistics.median(v) for k, v in t.items()}
    result = {
        "repeat": a.repeat,
        "seconds": t,
        "median": med,
        "save_diff_over_memory": med["save+diff"] / med["memory"],
        "memory_over_diff": med["memory"] / med["diff"],
        "memory_mirror_over_diff": med["memory+mirror"] / med["diff"],
        "targets": {"save_diff_over_memory_at_least": 2.0, "memory_over_diff_at_most": 1.2},
    }
    result["met"] = result["save_diff_over_memory"] >= 2.0 and result["memory_over_diff"] <= 1.2
    a.out_json.write_text(json.dumps(result, indent=1))
    print("| way | median s | runs |")
    print("|---|---|---|")
    for k in ("memory", "memory+mirror", "save", "save+diff", "diff"):
        print(f"| {k} | {med[k]:.3f} | {', '.join(f'{x:.3f}' for x in t[k])} |")
    print(f"\nsave+diff / memory = {result['save_diff_over_memory']:.2f} (target >= 2), "
          f"memory / diff = {result['memory_over_diff']:.2f} (target <= 1.2), "
          f"memory+mirror / diff = {result['memory_mirror_over_diff']:.2f}; "
          f"targets {'met' if result['met'] else 'MISSED'}")


if __name__ == "__main__":
    main()
