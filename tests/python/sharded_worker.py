"""One rank of a sharded trainer, for tests/python/test_sharded.py and scripts/bench/sharded.py.

Run as WORLD processes: ``sharded_worker.py SCENARIO WORKDIR RANK WORLD [VERSIONS]``. The ranks
form a gloo process group through a file in WORKDIR, ranks 0..WORLD/2-1 on host "a" (mirror
WORKDIR/mirror-a) and the rest on host "b" (WORKDIR/mirror-b), and publish VERSIONS versions into
WORKDIR/root from the pieces each holds:

- ``tp``: tensor-parallel and pipeline layouts over the generated tensors of WORKDIR/base (see
  expected()): row slices, column slices, a 2 x 2 grid, whole tensors per rank, a replicated
  norm, a 3-D tensor split on its second dimension;
- ``fsdp2``: a transformers Qwen3 model (WORKDIR/base, saved by the test) under FSDP2
  ``fully_shard``, one SGD step per version, published from its DTensor ``state_dict()``;
- ``gap``, ``overlap``, ``dtype``: ``tp`` with one rank giving a wrong piece;
- ``race``: another writer publishes version 1 while the ranks write theirs (a job restarted
  while its old one still runs): the ranks' publish raises, they reopen the publisher and publish
  version 2 on the other's version 1;
- ``live``: each rank holds a row range of every tensor of WORKDIR/base, and a trainer thread of
  its own keeps writing into it all through ``publish()`` (an optimizer step overlapping it); no
  gathered reference (what each version holds depends on when each chunk was read).

Each rank writes WORKDIR/result-RANK.json: the results, or the error (class, exit code, message).
Rank 0 also writes the gathered tensors of each version to WORKDIR/gathered-vN/model.safetensors
(test only: the reference the hosts must land on).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import numpy as np

# The new tensors of version v: the base's, with a seeded 2% of the elements changed.


def expected(base: dict[str, np.ndarray], v: int) -> dict[str, np.ndarray]:
    out = {}
    for i, (name, t) in enumerate(sorted(base.items())):
        rng = np.random.default_rng(1000 * v + i)
        flat = t.reshape(-1).copy()
        n = flat.size
        k = max(1, n // 50)
        pos = rng.choice(n, size=k, replace=False)
        flat[pos] = (flat[pos].astype(np.float32) + rng.standard_normal(k).astype(np.float32)).astype(t.dtype)
        out[name] = flat.reshape(t.shape)
    return out


def tp_pieces(pub, new: dict[str, np.ndarray], rank: int, world: int, scenario: str) -> None:
    """This rank's pieces of every tensor: the layouts a tensor-parallel, pipelined trainer holds."""
    def split(n: int, r: int) -> tuple[int, int]:  # torch.chunk-like, uneven
        step = -(-n // world)
        return min(n, r * step), min(n, (r + 1) * step)

    for name, t in sorted(new.items()):
        if name.endswith("embed.weight"):  # vocab-parallel: rows
            r0, r1 = split(t.shape[0], rank)
            if scenario == "gap" and rank == world - 1:
                continue
            if r1 > r0:
                pub.put(name, t[r0:r1], rows=(r0, r1))
        elif name.endswith("q_proj.weight"):  # column-parallel: columns
            c0, c1 = split(t.shape[1], rank)
            if scenario == "overlap" and rank == 1:
                c0 = max(0, c0 - 1)
            pub.put(name, np.ascontiguousarray(t[:, c0:c1]), cols=(c0, c1))
        elif name.endswith("o_proj.weight"):  # row-parallel: rows
            r0, r1 = split(t.shape[0], rank)
            piece = t[r0:r1]
            if scenario == "dtype" and rank == 2:
                piece = piece.astype(np.float32)
            pub.put(name, piece, rows=(r0, r1))
        elif name.endswith("experts.weight"):  # 3-D, split on its second dimension
            c0, c1 = split(t.shape[1], rank)
            pub.put(name, np.ascontiguousarray(t[:, c0:c1]), cols=(c0, c1))
        elif name.endswith("grid.weight"):  # a 2 x 2 grid of row and column ranges
            h, w = t.shape[0] // 2, t.shape[1] // 2
            i, j = divmod(rank % 4, 2)
            if rank < 4:
                rs = (0, h) if i == 0 else (h, t.shape[0])
                cs = (0, w) if j == 0 else (w, t.shape[1])
                pub.put(name, np.ascontiguousarray(t[rs[0]:rs[1], cs[0]:cs[1]]), rows=rs, cols=cs)
        elif name.endswith("norm.weight"):  # replicated on every rank
            pub.put(name, t, replicated=True)
        else:  # pipeline stages: whole tensors, each on one rank
            owner = sum(map(ord, name)) % world
            if owner == rank:
                pub.put(name, t)


def run_tp(pub, workdir: str, rank: int, world: int, versions: int, scenario: str) -> list[dict]:
    from safetensors.numpy import load_file, save_file

    base = load_file(os.path.join(workdir, "base", "model.safetensors"))
    results = []
    first = pub.version + 1
    for v in range(first, first + versions):
        new = expected(base, v)
        tp_pieces(pub, new, rank, world, scenario)
        r = pub.publish()
        results.append(r.__dict__)
        if rank == 0:
            d = os.path.join(workdir, f"gathered-v{v}")
            os.makedirs(d, exist_ok=True)
            save_file(new, os.path.join(d, "model.safetensors"))
    return results


def run_live(pub, workdir: str, rank: int, world: int, versions: int) -> list[dict]:
    import threading

    from safetensors.numpy import load_file

    base = load_file(os.path.join(workdir, "base", "model.safetensors"))
    results = []
    for _ in range(versions):
        pieces = []
        for name, t in sorted(base.items()):
            r0, r1 = t.shape[0] * rank // world, t.shape[0] * (rank + 1) // world
            piece = np.ascontiguousarray(t[r0:r1])
            piece.reshape(-1)[::97] += 1  # the step being published
            pub.put(name, piece, rows=(r0, r1))
            pieces.append(piece.reshape(-1))
        stop = threading.Event()

        def train() -> None:  # the next step, landing while publish() reads the pieces
            k = 0
            while not stop.wait(0.001):  # a write every millisecond, and the GIL let go between
                for flat in pieces:
                    flat[k % 4099::4099] += 1
                k += 1

        trainer = threading.Thread(target=train)
        trainer.start()
        try:
            r = pub.publish()
        finally:
            stop.set()
            trainer.join()
        results.append(r.__dict__)
    return results


def run_fsdp2(pub, workdir: str, rank: int, world: int, versions: int) -> list[dict]:
    import torch
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    model = AutoModelForCausalLM.from_pretrained(os.path.join(workdir, "base"), torch_dtype=torch.bfloat16)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    torch.manual_seed(1234)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    results = []
    for v in range(pub.version + 1, pub.version + 1 + versions):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        sd = model.state_dict()
        r = pub.publish(sd)
        results.append(r.__dict__)
        full = {k: t.full_tensor().contiguous() for k, t in sd.items()}  # test only: the reference
        if rank == 0:
            d = os.path.join(workdir, f"gathered-v{v}")
            os.makedirs(d, exist_ok=True)
            save_file(full, os.path.join(d, "model.safetensors"))
    return results


def run_race(pub, reopen, workdir: str, rank: int, world: int) -> list[dict]:
    import shutil

    import torch.distributed as dist
    from safetensors.numpy import load_file, save_file

    import hfdelta

    base = load_file(os.path.join(workdir, "base", "model.safetensors"))
    tp_pieces(pub, expected(base, 1), rank, world, "tp")
    if rank == 0:  # the other writer: version 1 from other bytes, published while the pieces wait
        other = os.path.join(workdir, "other")
        os.makedirs(other, exist_ok=True)
        save_file(expected(base, 99), os.path.join(other, "model.safetensors"))
        shutil.copy(os.path.join(workdir, "base", "config.json"), other)
        hfdelta.diff(os.path.join(workdir, "base"), other, os.path.join(workdir, "root"), sync=False)
    dist.barrier()
    lost = None
    try:
        pub.publish()
    except hfdelta.Exists as e:
        lost = e.message
    pub.close()
    again = reopen()  # all it takes: opening catches each host's mirror up to the other's version
    try:
        reopened_at = again.version
        new = expected(base, 2)
        tp_pieces(again, new, rank, world, "tp")
        r = again.publish()
        if rank == 0:
            d = os.path.join(workdir, "gathered-v2")
            os.makedirs(d, exist_ok=True)
            save_file(new, os.path.join(d, "model.safetensors"))
    finally:
        again.close()
    return [{"lost": lost, "reopened_at": reopened_at, "published": r.__dict__}]


def main() -> int:
    scenario, workdir, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    versions = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    import torch.distributed as dist

    import hfdelta

    dist.init_process_group("gloo", init_method="file://" + os.path.join(workdir, "pg"), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    host = "a" if rank < world // 2 or world == 1 else "b"
    out: dict = {"rank": rank}
    def open_publisher() -> "hfdelta.ShardedPublisher":
        return hfdelta.ShardedPublisher(os.path.join(workdir, "root"), os.path.join(workdir, "mirror-" + host),
                                        host=host, encoding=os.environ.get("SHARD_ENCODING", "sparse"), sync=False)

    try:
        with open_publisher() as pub:
            out["opening"] = pub.opening
            if scenario == "race":
                out["results"] = run_race(pub, open_publisher, workdir, rank, world)
            elif scenario == "fsdp2":
                out["results"] = run_fsdp2(pub, workdir, rank, world, versions)
            elif scenario == "live":
                out["results"] = run_live(pub, workdir, rank, world, versions)
            else:
                out["results"] = run_tp(pub, workdir, rank, world, versions, scenario)
    except hfdelta.HfdeltaError as e:
        out["error"] = {"class": type(e).__name__, "exit_code": e.exit_code, "message": e.message}
    except Exception as e:  # a peer killed mid-collective: gloo's own error
        out["error"] = {"class": type(e).__name__, "exit_code": -1, "message": str(e),
                        "trace": traceback.format_exc()}
    with open(os.path.join(workdir, f"result-{rank}.json"), "w") as f:
        json.dump(out, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
