"""Shared fixtures: the hfdelta binaries (HFDELTA_DIFF, HFDELTA_APPLY,
HFDELTA_GEN) and functions that run them. Every delta directory delta-diff
writes in these tests is opened and checked with the real readers
(safetensors.safe_open, json, zstandard, xxhash) before the test goes on.
"""

import json
import os
import subprocess

import numpy as np
import pytest
import safetensors
import xxhash
import zstandard

import stio

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TESTDATA = os.environ.get("HFDELTA_TESTDATA", os.path.join(REPO, "testdata"))


def _bin(var, name, subdir="src"):
    p = os.environ.get(var) or os.path.join(REPO, "build", subdir, name)
    if not os.access(p, os.X_OK):
        pytest.exit(f"{var} not set and {p} is not an executable (build the project first)", returncode=2)
    return p


class HF:
    """Runs delta-diff and delta-apply."""

    def __init__(self):
        self.diff_bin = _bin("HFDELTA_DIFF", "delta-diff")
        self.apply_bin = _bin("HFDELTA_APPLY", "delta-apply")
        self.gen_bin = _bin("HFDELTA_GEN", "hfdelta-gen", "tools")
        self.deltas_checked = 0

    @staticmethod
    def run(argv, expect=0):
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if expect is not None:
            assert p.returncode == expect, (
                f"{' '.join(argv)} exited {p.returncode}, expected {expect}\n"
                f"stdout: {p.stdout}\nstderr: {p.stderr}"
            )
        return p

    def diff(self, base, new, out, encoding="xor", extra=(), expect=0, check=True):
        p = self.run([self.diff_bin, "-q", "--encoding", encoding, *extra, base, new, out], expect)
        if expect == 0 and check:
            check_delta_dir(out, base, new)
            self.deltas_checked += 1
        return p

    def apply(self, *args, expect=0):
        return self.run([self.apply_bin, "-q", *args], expect)

    def init(self, src, local, version=0, expect=0):
        return self.apply("--init", "--init-version", str(version), src, local, expect=expect)


@pytest.fixture(scope="session")
def hf():
    return HF()


# ------------------------------------------------------------ real readers


def check_delta_dir(out, base, new):
    """A delta directory written by delta-diff, checked with the real readers:

    - the index parses with json and carries the slime metadata as strings;
    - every *.safetensors file opens with safetensors.safe_open(framework="numpy"),
      every entry is uint8 1-D, and __metadata__[entry] is
      xxhash.xxh3_128_hexdigest of the tensor's new bytes;
    - entries are exactly the changed tensors, each one zstd frame (with its
      content size recorded) that decodes to what its encoding says.
    """
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    m = index["metadata"]
    for k in ("version", "base_version"):
        assert isinstance(m[k], str) and len(m[k]) == 6 and m[k].isdigit(), (k, m[k])
    # A structural delta (hfdelta_shards) records its encodings per tensor
    # under delta_encoding "auto", which plain-layout readers refuse rather
    # than patch tensors by name into files whose layout changed.
    structural = "hfdelta_shards" in m
    if structural:
        assert m["delta_encoding"] == "auto" and m["hfdelta_format"] == 3
    else:
        assert m["delta_encoding"] in ("xor", "overwrite")
    assert m["compression_format"] == "zstd"
    assert m["checksum_format"] == "xxh3-128"

    def enc_of(name):
        return m["hfdelta_encodings"][name] if structural else m["delta_encoding"]

    old_t = stio.checkpoint_tensors(base)
    new_t = stio.checkpoint_tensors(new)
    # Where each tensor's base bytes come from: a built file names its source
    # ("from"; none: zeros), other files keep the tensor's own name.
    source = {n: n for n in new_t if n in old_t and len(old_t[n][3]) == len(new_t[n][3])}
    for op in m.get("hfdelta_shards", []):
        for t in op.get("tensors", []):
            source[t["name"]] = t.get("from")
    old_of = {n: old_t[source[n]][3] if source.get(n) else bytes(len(new_t[n][3])) for n in new_t}
    changed = sorted(n for n in new_t if new_t[n][3] != old_of[n])

    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert sorted(set(index["weight_map"].values())) == files
    seen = {}
    for f in files:
        with safetensors.safe_open(os.path.join(out, f), framework="numpy") as st:
            meta = st.metadata() or {}
            for name in st.keys():
                arr = st.get_tensor(name)
                assert arr.dtype == np.uint8 and arr.ndim == 1, (f, name, arr.dtype, arr.shape)
                assert index["weight_map"][name] == f
                newb, oldb = new_t[name][3], old_of[name]
                assert meta[name] == xxhash.xxh3_128_hexdigest(newb), (f, name)
                assert meta[name] == xxhash.xxh3_128(newb).hexdigest()
                frame = arr.tobytes()
                params = zstandard.get_frame_parameters(frame)
                d = zstandard.ZstdDecompressor().decompressobj()
                raw = d.decompress(frame)
                assert d.eof and not d.unused_data, f"{name}: not exactly one zstd frame"
                assert params.content_size == len(raw), f"{name}: frame does not record its content size"
                a = np.frombuffer(oldb, dtype=np.uint8)
                b = np.frombuffer(newb, dtype=np.uint8)
                if enc_of(name) == "xor":
                    assert raw == (a ^ b).tobytes(), name
                else:
                    pos = np.flatnonzero(a != b)
                    want = np.array([pos.size], "<u4").tobytes() + pos.astype("<u4").tobytes() + b[pos].tobytes()
                    assert raw == want, name
                seen[name] = f
    assert sorted(seen) == changed, f"entries {sorted(seen)} != changed tensors {changed}"
    assert sorted(index["weight_map"]) == changed
    return index
