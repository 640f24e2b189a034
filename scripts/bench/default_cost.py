#!/usr/bin/env python3
"""What the default encoding (context) costs and saves against sparse, side by side.

For each pair of saves (BASE, NEW) given, in one run: the bytes of a version written
with each encoding (weight files and index), and the wall time of delta-diff writing it
and of delta-apply --no-sync applying it to a copy of BASE (made before the clock starts),
the two encodings' commands interleaved, RUNS times each after one warm-up round (the page
cache is warm); the median of each, and the median of the per-round ratios
context / sparse. Every applied LOCAL is checked against NEW (delta-apply --verify, and
the weight files compared byte for byte).

Usage: default_cost.py --builddir BUILD --pair LABEL=BASE,NEW [--pair ...] [--runs N]
                       [--threads T] [--work DIR] [--out FILE]
  --work DIR   scratch directory (versions and LOCAL copies); a tmpfs such as /dev/shm
               takes the disk out of the figures (default: a directory in /tmp)
  --out FILE   also write the table (markdown) and the raw figures (FILE.json)
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENCODINGS = ("sparse", "context")


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"default_cost: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return wall, r.stdout


def tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json")
               and p.name != "hfdelta_complete.json")


def same_weights(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.safetensors"))
    return names == sorted(p.name for p in b.glob("*.safetensors")) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def measure(label: str, base: Path, new: Path, a: argparse.Namespace, work: Path) -> dict:
    diff, apply_ = str(Path(a.builddir) / "src/delta-diff"), str(Path(a.builddir) / "src/delta-apply")
    threads = ["--threads", str(a.threads)] if a.threads else []
    w = work / label
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    subprocess.run([apply_, "-q", "--init", str(base), str(w / "tpl")], check=True)
    times: dict[str, dict[str, list[float]]] = {e: {"diff": [], "apply": []} for e in ENCODINGS}
    facts: dict[str, dict] = {}
    for rnd in range(a.runs + 1):
        for enc in ENCODINGS:
            out = w / f"root-{enc}" / "weight_v000001"
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir()
            t, js = timed([diff, "--json", "--encoding", enc, *threads, str(base), str(new), str(out)])
            local = w / f"local-{enc}"
            shutil.rmtree(local, ignore_errors=True)
            shutil.copytree(w / "tpl", local, symlinks=True)
            ta, _ = timed([apply_, "-q", "--no-sync", *threads, str(out), str(local)])
            if rnd == 0:  # the warm-up round: what was written, and that it applies exactly
                j = json.loads(js)
                subprocess.run([apply_, "-q", "--verify", str(local)], check=True)
                if not same_weights(local, new):
                    sys.exit(f"default_cost: {label}: applying the {enc} version did not give NEW's weight files")
                facts[enc] = {"bytes": tree_bytes(out), "elements": j["elements"],
                              "elements_changed": j["elements_changed"]}
                continue
            times[enc]["diff"].append(t)
            times[enc]["apply"].append(ta)
    shutil.rmtree(w, ignore_errors=True)
    row = {"label": label, "base": str(base), "new": str(new),
           "density": facts["sparse"]["elements_changed"] / max(1, facts["sparse"]["elements"])}
    for enc in ENCODINGS:
        row[enc] = {"bytes": facts[enc]["bytes"], "diff_s": statistics.median(times[enc]["diff"]),
                    "apply_s": statistics.median(times[enc]["apply"]), "runs": times[enc]}
    for what in ("diff", "apply"):
        row[f"{what}_ratio"] = statistics.median(
            c / s for c, s in zip(times["context"][what], times["sparse"][what]))
    row["bytes_ratio"] = row["context"]["bytes"] / row["sparse"]["bytes"]
    return row


def table(rows: list[dict]) -> str:
    out = ["| pair | density | `sparse` | `context` (default) | size | diff `sparse` / `context` | diff | "
           "apply `--no-sync` `sparse` / `context` | apply |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, c = r["sparse"], r["context"]
        out.append(f"| {r['label']} | {100 * r['density']:.2f}% | {s['bytes'] / 1e6:.2f} MB | {c['bytes'] / 1e6:.2f} MB | "
                   f"{r['bytes_ratio']:.3f}× | {s['diff_s']:.3f} / {c['diff_s']:.3f} s | {r['diff_ratio']:.2f}× | "
                   f"{s['apply_s']:.3f} / {c['apply_s']:.3f} s | {r['apply_ratio']:.2f}× |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builddir", required=True)
    ap.add_argument("--pair", action="append", required=True, help="LABEL=BASE,NEW")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="default-cost-", dir=a.work))
    rows = []
    try:
        for spec in a.pair:
            label, _, paths = spec.partition("=")
            base, _, new = paths.partition(",")
            if not (label and base and new):
                sys.exit(f"default_cost: --pair {spec!r}: give LABEL=BASE,NEW")
            rows.append(measure(label, Path(base), Path(new), a, work))
            print(f"default_cost: {label}: size {rows[-1]['bytes_ratio']:.3f}x, diff {rows[-1]['diff_ratio']:.2f}x, "
                  f"apply {rows[-1]['apply_ratio']:.2f}x", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = table(rows)
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)
        Path(a.out + ".json").write_text(json.dumps({"threads": a.threads, "runs": a.runs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
