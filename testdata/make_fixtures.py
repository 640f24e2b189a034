#!/usr/bin/env python3
"""Regenerates the fixtures in this directory, deterministically (fixed seeds).

    python3 testdata/make_fixtures.py [--out DIR] [--torch] [--check]

Needs safetensors, numpy, ml_dtypes, zstandard and xxhash (scripts/ci/interop.sh
installs them into build/interop-venv); --torch also needs torch and writes
producers/torch_all_dtypes.safetensors (otherwise the existing one is kept).
--check regenerates into a temporary directory and compares with the fixtures
here (same headers as JSON, same tensor bytes, same decoded delta frames),
exiting 1 on a difference.

Everything below is written by the real safetensors library (numpy or torch
front end); the slime-style deltas are written by the reference publisher of
tests/interop/slime_ref.py. MANIFEST.json records, for every safetensors
file, its tensors (dtype, shape, byte length, XXH3-128 of the bytes) and
__metadata__, and the library versions that made them; the C++ tests
(tests/test_fixtures.cpp) read it without Python.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "interop"))

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy  # noqa: E402
import xxhash  # noqa: E402
import zstandard  # noqa: E402

import producers  # noqa: E402
import slime_ref  # noqa: E402
import stio  # noqa: E402

TORCH_FILE = "producers/torch_all_dtypes.safetensors"
# The subdirectories this script writes; other files under testdata/ are not its own.
OWN = ("producers", "checkpoint", "slime")


def versions(with_torch):
    import importlib.metadata as md

    pkgs = ["safetensors", "numpy", "ml_dtypes", "zstandard", "xxhash"] + (["torch"] if with_torch else [])
    return {p: md.version(p) for p in pkgs}


def make_numpy(out):
    os.makedirs(os.path.join(out, "producers"), exist_ok=True)
    # Every dtype safetensors.numpy writes, with a one-key __metadata__ (the
    # library orders several keys differently from save to save).
    safetensors.numpy.save_file(
        producers.all_dtypes_tensors(seed=1),
        os.path.join(out, "producers", "numpy_all_dtypes.safetensors"),
        metadata={"format": "np"},
    )
    # Scalars and empty tensors only, no __metadata__.
    small = {
        "scalar.f32": np.array(3.25, dtype=np.float32),
        "scalar.bf16": np.array(-2.0, dtype=producers.NUMPY_DTYPES["BF16"]),
        "scalar.bool": np.array(True),
        "scalar.i64": np.array(-7, dtype=np.int64),
        "empty.f16": np.zeros((0,), dtype=np.float16),
        "empty.u8_2d": np.zeros((4, 0), dtype=np.uint8),
        "empty.f8": np.zeros((0, 3), dtype=producers.NUMPY_DTYPES["F8_E5M2"]),
    }
    safetensors.numpy.save_file(small, os.path.join(out, "producers", "numpy_scalars_empty.safetensors"))

    # A sharded mini checkpoint pair (three shards, an index, config.json) and
    # the slime-style deltas between them, version 0 -> 1.
    tmp = tempfile.mkdtemp()
    try:
        base, new = producers.series(tmp, 2, seed=101, sharded=True, metadata={"format": "pt"})
        for name, src in (("base", base), ("new", new)):
            dst = os.path.join(out, "checkpoint", name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
    finally:
        shutil.rmtree(tmp)
    for enc in ("xor", "overwrite"):
        dst = os.path.join(out, "slime", enc)
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        slime_ref.publish(os.path.join(out, "checkpoint", "base"), os.path.join(out, "checkpoint", "new"),
                          dst, 1, 0, encoding=enc, level=1)


def make_torch(out):
    import safetensors.torch
    import torch

    import producers_torch

    torch.manual_seed(0)
    t = producers_torch.all_dtypes_tensors(seed=2)
    safetensors.torch.save_file(t, os.path.join(out, TORCH_FILE), metadata={"format": "pt"})


def describe(path):
    n, hdr = stio.read_header(path)
    tensors = {}
    for name, (dt, shape, raw) in sorted(stio.read_tensors(path).items()):
        tensors[name] = {"dtype": dt, "shape": shape, "nbytes": len(raw), "xxh3_128": xxhash.xxh3_128_hexdigest(raw)}
    return {"size": os.path.getsize(path), "header_len": n, "metadata": hdr.get("__metadata__"), "tensors": tensors}


def write_manifest(out, made_with):
    files = {}
    for sub in OWN:
        for d, _, fs in os.walk(os.path.join(out, sub)):
            for f in fs:
                if f.endswith(".safetensors"):
                    rel = os.path.relpath(os.path.join(d, f), out)
                    files[rel] = describe(os.path.join(d, f))
    manifest = {"made_with": made_with, "files": dict(sorted(files.items()))}
    with open(os.path.join(out, "MANIFEST.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")


def compare(here, fresh):
    """Differences between two fixture trees, as text lines (empty: same)."""
    problems = []
    a, b = {}, {}
    for sub in OWN:
        for tree, top in ((a, here), (b, fresh)):
            if os.path.isdir(os.path.join(top, sub)):
                tree.update({os.path.join(sub, k): v for k, v in stio.tree(os.path.join(top, sub)).items()})
    for rel in sorted(set(a) | set(b)):
        if rel == TORCH_FILE:
            continue
        if rel not in a or rel not in b:
            problems.append(f"{rel}: only in {'fresh' if rel in b else 'committed'} fixtures")
            continue
        if a[rel] == b[rel]:
            continue
        pa, pb = os.path.join(here, rel), os.path.join(fresh, rel)
        if not rel.endswith(".safetensors"):
            problems.append(f"{rel}: bytes differ")
            continue
        if stio.read_header(pa)[1] != stio.read_header(pb)[1]:
            problems.append(f"{rel}: header differs")
            continue
        ta, tb = stio.read_tensors(pa), stio.read_tensors(pb)
        for name in ta:
            if ta[name][2] == tb[name][2]:
                continue
            if rel.startswith("slime/"):  # another zstd build may pick other bytes for the same content
                da = zstandard.ZstdDecompressor().decompressobj().decompress(ta[name][2])
                db = zstandard.ZstdDecompressor().decompressobj().decompress(tb[name][2])
                if da == db:
                    continue
            problems.append(f"{rel}: tensor {name} differs")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--torch", action="store_true", help="also write " + TORCH_FILE)
    ap.add_argument("--check", action="store_true", help="regenerate elsewhere and compare with --out")
    args = ap.parse_args()
    if args.check:
        fresh = tempfile.mkdtemp()
        try:
            make_numpy(fresh)
            problems = compare(args.out, fresh)
        finally:
            shutil.rmtree(fresh)
        for p in problems:
            print("fixture mismatch:", p)
        print("fixtures: " + ("identical to a fresh regeneration" if not problems else f"{len(problems)} differences"))
        return 1 if problems else 0
    make_numpy(args.out)
    if args.torch:
        make_torch(args.out)
    old = {}
    mf = os.path.join(args.out, "MANIFEST.json")
    if os.path.exists(mf):
        with open(mf) as fh:
            old = json.load(fh).get("made_with", {})
    made_with = versions(args.torch)
    if not args.torch and "torch" in old and os.path.exists(os.path.join(args.out, TORCH_FILE)):
        made_with["torch"] = old["torch"]  # kept from the run that wrote it
    write_manifest(args.out, made_with)
    print("fixtures written to", args.out, "with", ", ".join(f"{k} {v}" for k, v in made_with.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
