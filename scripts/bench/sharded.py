"""Sharded publishing against gathering, side by side in one run (bench.sh's section `sharded`).

For each rank count R, R gloo processes on this machine each hold a row range of every tensor of
NEW (read from the save once, before the clock starts: what a trainer holds in memory), and
publish one version on MIRROR (a copy of BASE) three ways:

- sharded:      hfdelta.ShardedPublisher, every rank its own pieces, no gather;
- gather+pub:   every tensor gathered to rank 0 (dist.gather), rank 0's hfdelta.Publisher;
- gather+diff:  every tensor gathered to rank 0, saved (safetensors save_file, as save_pretrained
                writes), then delta-diff MIRROR SAVE ROOT.

Reported per mode and R: wall time of the publish (a barrier before and after it), bytes of the
mirror read by each rank, and each rank's peak anonymous memory (RssAnon, sampled) above what it
held once its pieces were loaded. Usage: sharded.py BASE NEW OUT_JSON [--ranks "1 2 4"] [--delta-diff PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class AnonPeak:
    """The peak of this process's anonymous memory (RssAnon), sampled every 10 ms: VmHWM would count
    the mirror's pages the apply maps, which are the page cache's, not the rank's."""

    def __init__(self) -> None:
        import threading

        self.peak = vm("RssAnon")
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, vm("RssAnon"))

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, vm("RssAnon"))


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rank_main(mode: str, rank: int, world: int, base: str, new: str, work: str, delta_diff: str) -> None:
    import torch
    import torch.distributed as dist
    from safetensors import safe_open
    from safetensors.torch import save_file

    import hfdelta

    dist.init_process_group("gloo", init_method="file://" + work + "/pg", rank=rank, world_size=world)
    pieces: dict[str, tuple[torch.Tensor, int, int, list[int]]] = {}
    file_of: dict[str, str] = {}  # the weight file of each tensor, for the gathered save
    for f in sorted(Path(new).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for name in sf.keys():
                file_of[name] = f.name
                sl = sf.get_slice(name)
                shape = list(sl.get_shape())
                rows = shape[0] if shape else 1
                step = -(-rows // world)
                r0, r1 = min(rows, rank * step), min(rows, (rank + 1) * step)
                if not shape:
                    if rank == 0:
                        pieces[name] = (sf.get_tensor(name), 0, 1, shape)
                elif r1 > r0:
                    pieces[name] = (sl[r0:r1].contiguous(), r0, r1, shape)
                else:
                    pieces[name] = (torch.empty(0), r0, r0, shape)
    anon0 = vm("RssAnon")
    root, mirror = work + "/root", work + "/mirror"
    dist.barrier()
    t0 = time.monotonic()
    peak = AnonPeak()
    read = 0
    if mode == "sharded":
        with hfdelta.ShardedPublisher(root, mirror, sync=False) as pub:  # one host: one mirror, one advance
            for name, (t, r0, r1, shape) in pieces.items():
                if r1 > r0:
                    pub.put(name, t, rows=(r0, r1)) if shape else pub.put(name, t)
            r = pub.publish()
            read = r.mirror_bytes_read
    else:
        def gathered() -> Any:
            for name, (t, r0, r1, shape) in sorted(pieces.items()):
                if not shape:
                    yield name, t
                    continue
                rows = shape[0]
                step = -(-rows // world)
                mine = torch.zeros([step] + shape[1:], dtype=t.dtype)  # gather takes equal sizes: padded
                if r1 > r0:
                    mine[: r1 - r0] = t
                outs = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
                dist.gather(mine, outs, dst=0)
                if rank == 0:
                    yield name, torch.cat(outs)[:rows].contiguous()

        if mode == "gather+pub":
            if rank == 0:
                with hfdelta.Publisher(root, mirror, sync=False, background=False) as pub:
                    pub.publish(gathered())
                read = sum(os.path.getsize(f) for f in Path(mirror).glob("*.safetensors"))
            else:
                for _ in gathered():
                    pass
        else:
            full = dict(gathered())
            if rank == 0:
                save = work + "/save"
                os.makedirs(save, exist_ok=True)
                for f in Path(new).iterdir():
                    if f.suffix != ".safetensors" and f.is_file():
                        shutil.copy(f, save)
                for fname in sorted(set(file_of.values())):  # the save's weight files, as NEW has them
                    save_file({n: t for n, t in full.items() if file_of[n] == fname}, save + "/" + fname,
                              metadata={"format": "pt"})
                subprocess.run([delta_diff, "--no-sync", mirror, save, root], check=True, capture_output=True)
                read = sum(os.path.getsize(f) for f in Path(mirror).glob("*.safetensors"))
            del full
    dist.barrier()
    seconds = time.monotonic() - t0
    out = {"rank": rank, "seconds": seconds, "mirror_read": read, "peak_above_loaded": peak.stop() - anon0}
    Path(work, f"r{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def run(mode: str, world: int, base: Path, new: Path, scratch: Path, delta_diff: str) -> dict[str, Any]:
    import hfdelta

    work = scratch / f"{mode}-{world}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "root").mkdir(parents=True)
    hfdelta.init(base, work / "mirror", sync=False)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", mode, str(r), str(world), str(base), str(new),
                               str(work), delta_diff]) for r in range(world)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"{mode} with {world} ranks: a rank failed (exit {p.returncode})")
    ranks = [json.loads((work / f"r{r}.json").read_text()) for r in range(world)]
    shutil.rmtree(work, ignore_errors=True)
    return {"mode": mode, "ranks": world, "seconds": max(r["seconds"] for r in ranks),
            "mirror_read": [r["mirror_read"] for r in ranks], "peak_above_loaded": [r["peak_above_loaded"] for r in ranks]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        rank_main(a[0], int(a[1]), int(a[2]), a[3], a[4], a[5], a[6])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", default="1 2 4")
    ap.add_argument("--delta-diff", default="build/src/delta-diff")
    o = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir=o.out.parent))
    rows = []
    mib = sum(os.path.getsize(f) for f in o.base.glob("*.safetensors")) / 2**20
    print(f"sharded publish of a {mib:.0f} MiB save, ranks {o.ranks}, gloo on {os.cpu_count()} cores")
    print(f"{'mode':12} {'ranks':>5} {'seconds':>8} {'x sharded':>9} {'mirror MiB read per rank':>28} "
          f"{'peak anon MiB above loaded, per rank':>38}")
    for world in map(int, o.ranks.split()):
        res = {m: run(m, world, o.base.resolve(), o.new.resolve(), scratch, os.path.abspath(o.delta_diff))
               for m in ("sharded", "gather+pub", "gather+diff")}
        for m, r in res.items():
            r["ratio_to_sharded"] = r["seconds"] / res["sharded"]["seconds"]
            reads = " ".join(f"{x / 2**20:.0f}" for x in r["mirror_read"])
            peaks = " ".join(f"{x / 2**20:.0f}" for x in r["peak_above_loaded"])
            print(f"{m:12} {world:5} {r['seconds']:8.2f} {r['ratio_to_sharded']:9.2f} {reads:>28} {peaks:>38}")
            rows.append(r)
    shutil.rmtree(scratch, ignore_errors=True)
    o.out.write_text(json.dumps({"save_mib": mib, "cores": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
