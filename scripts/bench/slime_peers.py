"""The slime layout's encodings side by side with its peers' publisher and
receivers, in one run: wire size and apply time of each version, by each
receiver.

Versions of one pair of saves (SERIES/save_000 -> save_001), each encoding
(xor, overwrite) written by:
  LABEL        delta-diff of each --hfdelta LABEL=BUILDDIR given (e.g. a build
               from before a change and one from after it);
  peer         the slime/miles publisher's way, tests/interop/slime_ref.py:
               each changed tensor's XOR mask (or overwrite record) compressed
               by python-zstandard's ZstdCompressor(level=1).compress, every
               entry in one safetensors file, as slime's and miles'
               publishers call them.
Receivers, each on a fresh copy of LOCAL at save_000 for every run:
  delta-apply  delta-apply --no-sync of the last --hfdelta build;
  pull()       SGLang's pull() (sglang.srt.weight_sync.local_checkpoint) as the
               --slime checkout's docker/patch/latest/sglang-pull_weights.patch
               adds it (skipped without --slime);
  reference    the reference applier of tests/interop/slime_ref.py.
Python receivers are timed around the call, in a process of their own; delta-apply
from its start to its exit. Each is given as wall seconds and CPU seconds (user +
system, all threads): on a shared machine the CPU time says more. Every figure is the
median of --runs, the runs of all versions interleaved; the page cache is warm (every
input is read before).

Needs numpy, zstandard, xxhash and safetensors (scripts/ci/interop.sh makes such a
venv in BUILDDIR/interop-venv). SERIES is the pair docs/performance.md measures:
  build/tools/hfdelta-gen --preset qwen3-0.6b --saves 1 SERIES
Run as in docs/performance.md ("The slime layout beside its peers"):
  build/interop-venv/bin/python scripts/bench/slime_peers.py --series SERIES --work W \
      --hfdelta before=OLD/build --hfdelta after=build --slime SLIME --local /dev/shm \
      --runs 5 --lock LOCKFILE --out W/table.md

--local DIR puts LOCAL and its templates there instead of in --work (a tmpfs such
as /dev/shm takes the disk out of the figures). --version LABEL:ENCODING=DIR adds a
version directory made elsewhere (of the same pair) to the table, e.g. another layout of
the same frames. --lock FILE holds an flock on FILE (a shared machine's bench lock) for
each run of every version by every receiver, and only then: the publishing and the
checks between runs happen outside it.

Usage: slime_peers.py --series DIR --work DIR --hfdelta LABEL=BUILDDIR [...]
                      [--version LABEL:ENCODING=DIR ...] [--slime DIR] [--local DIR] [--runs N]
                      [--lock FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "interop"))

ENCODINGS = ("xor", "overwrite")
PATCH = "docker/patch/latest/sglang-pull_weights.patch"
MODULE = "python/sglang/srt/weight_sync/local_checkpoint.py"


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def read_all(d: Path) -> None:
    for f in sorted(d.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def extract_pull(slime: Path, dst: Path) -> Path:
    """The module a patch adds, as a file: its '+' lines after its header."""
    lines, inside = [], False
    for line in (slime / PATCH).read_text().splitlines():
        if line.startswith("+++ "):
            inside = line.endswith("/" + MODULE)
            continue
        if inside and line.startswith("diff --git"):
            break
        if inside and line.startswith("+"):
            lines.append(line[1:])
    if not lines:
        sys.exit(f"slime_peers: {slime / PATCH} adds no {MODULE}")
    dst.write_text("\n".join(lines) + "\n")
    return dst


def delta_bytes(v: Path) -> tuple[int, int, int]:
    """(delta files, their bytes, every file's bytes) of a version directory."""
    files = sorted(v.glob("*.safetensors"))
    every = sum(f.stat().st_size for f in v.rglob("*") if f.is_file())
    return len(files), sum(f.stat().st_size for f in files), every


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def receive(kind: str, vdir: str, local: str, base: str, module: str) -> tuple[float, float]:
    """One timed apply in this process (the --receive form): wall and CPU seconds."""
    if kind == "pull":
        spec = importlib.util.spec_from_file_location("local_checkpoint", module)
        lc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lc)
        call = lambda: lc.pull(local, base, os.path.dirname(vdir), 1)  # noqa: E731
    else:
        import slime_ref

        call = lambda: slime_ref.apply(vdir, local)  # noqa: E731
    c, t = cpu(resource.RUSAGE_SELF), time.perf_counter()
    call()
    return time.perf_counter() - t, cpu(resource.RUSAGE_SELF) - c


def fresh_local(template: Path, local: Path) -> None:
    if local.exists():
        shutil.rmtree(local)
    shutil.copytree(template, local, symlinks=True)
    read_all(local)


@contextlib.contextmanager
def held(lock: Path | None):
    """An exclusive flock on LOCK for the block (nothing without one)."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=Path)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--hfdelta", action="append", default=[], metavar="LABEL=BUILDDIR")
    ap.add_argument("--version", action="append", default=[], metavar="LABEL:ENCODING=DIR")
    ap.add_argument("--slime", type=Path)
    ap.add_argument("--local", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lock", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--receive", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.receive:
        print(*receive(*a.receive))
        return
    if not a.series or not a.work or not a.hfdelta:
        ap.error("--series, --work and at least one --hfdelta are required")

    import slime_ref

    s0, s1 = a.series / "save_000", a.series / "save_001"
    builds = [(lab, Path(b).resolve()) for lab, b in (h.split("=", 1) for h in a.hfdelta)]
    apply_bin = str(builds[-1][1] / "src" / "delta-apply")
    w = a.work.resolve()
    if w.exists():
        shutil.rmtree(w)
    w.mkdir(parents=True)
    module = str(extract_pull(a.slime, w / "local_checkpoint.py")) if a.slime else ""

    # Publishers.
    versions: list[tuple[str, str, Path]] = []
    for enc in ENCODINGS:
        for lab, b in builds:
            root = w / f"{lab}-{enc}"
            root.mkdir()
            run([str(b / "src" / "delta-diff"), "-q", "--encoding", enc, "--delta-version", "1", str(s0), str(s1),
                 str(root / "weight_v000001")])
            versions.append((lab, enc, root / "weight_v000001"))
        root = w / f"peer-{enc}"
        root.mkdir()
        slime_ref.publish(str(s0), str(s1), str(root / "weight_v000001"), 1, encoding=enc, level=1)
        versions.append(("peer", enc, root / "weight_v000001"))

    for spec in a.version:
        what, d = spec.split("=", 1)
        lab, enc = what.split(":", 1)
        root = w / f"{lab}-{enc}"
        shutil.copytree(d, root / "weight_v000001")
        versions.append((lab, enc, root / "weight_v000001"))

    # LOCAL at save_000, as each receiver keeps it.
    lw = (a.local / "slime-peers") if a.local else w
    if a.local:
        shutil.rmtree(lw, ignore_errors=True)
        lw.mkdir(parents=True)
    t_hfd, t_peer = lw / "local-hfdelta", lw / "local-peer"
    run([apply_bin, "-q", "--init", str(s0), str(t_hfd)])
    slime_ref.init(str(s0), str(t_peer), 0)
    receivers = ["delta-apply"] + (["pull()"] if module else []) + ["reference"]
    times: dict[tuple[int, str], list[tuple[float, float]]] = {}
    local = lw / "local"
    for v in versions:
        read_all(v[2])
    # A first run, not counted and outside the lock, checks that every receiver
    # leaves LOCAL at save_001 (and warms the page cache and the interpreter).
    def one(vdir: Path, rc: str) -> tuple[float, float]:
        fresh_local(t_hfd if rc == "delta-apply" else t_peer, local)
        if rc == "delta-apply":
            c, t = cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
            run([apply_bin, "-q", "--no-sync", str(vdir), str(local)])
            return time.perf_counter() - t, cpu(resource.RUSAGE_CHILDREN) - c
        kind = "pull" if rc == "pull()" else "reference"
        out = subprocess.run([sys.executable, __file__, "--receive", kind, str(vdir), str(local), str(s0), module],
                             check=True, capture_output=True, text=True).stdout
        return tuple(float(x) for x in out.split()[-2:])

    for lab, enc, vdir in versions:
        for rc in receivers:
            one(vdir, rc)
            for f in slime_ref.stio.weight_files(str(s1)):
                if (local / f).read_bytes() != (s1 / f).read_bytes():
                    sys.exit(f"slime_peers: {rc} of {vdir} left {f} unlike save_001")
    loads = []
    for r in range(a.runs):
        with held(a.lock):
            loads.append(os.getloadavg()[0])
            for i, (lab, enc, vdir) in enumerate(versions):
                for rc in receivers:
                    dt = one(vdir, rc)
                    times.setdefault((i, rc), []).append(dt)
                    print(f"slime_peers: run {r + 1}: {lab} {enc} {rc} {dt[0]:.3f} s, CPU {dt[1]:.3f} s",
                          file=sys.stderr)

    peer = {enc: delta_bytes(v) for lab, enc, v in versions if lab == "peer"}
    head = "| publisher | encoding | delta files | their bytes | / peer's | directory bytes | " + " | ".join(
        f"{rc} wall / CPU (s)" for rc in receivers) + " |"
    rows = [head, "|---|---|---:|---:|---:|---:|" + "---:|" * len(receivers)]
    result = []
    for i, (lab, enc, v) in enumerate(versions):
        n, b, every = delta_bytes(v)
        med = {rc: [statistics.median(x[k] for x in times[(i, rc)]) for k in (0, 1)] for rc in receivers}
        cells = " | ".join(f"{med[rc][0]:.3f} / {med[rc][1]:.3f}" for rc in receivers)
        rows.append(f"| {lab} | {enc} | {n} | {b} | {b / peer[enc][1]:.4f} | {every} | {cells} |")
        result.append({"publisher": lab, "encoding": enc, "files": n, "delta_bytes": b, "dir_bytes": every,
                       "apply_wall_cpu_s": {rc: times[(i, rc)] for rc in receivers}})
    text = (f"{a.runs} runs, medians; receivers on a fresh LOCAL at save_000 each run, page cache warm; "
            f"load average at each run's start {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores\n\n"
            + "\n".join(rows) + "\n")
    print(text)
    if a.out:
        a.out.write_text(text)
        a.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    if a.local:
        shutil.rmtree(lw)


if __name__ == "__main__":
    main()
