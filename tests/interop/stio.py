"""Raw, byte-level view of safetensors files and checkpoint directories.

Written from the format description only (8-byte little-endian header length,
JSON header, data buffer), so it can read every dtype, including those that
safetensors.numpy cannot turn into arrays (BF16, F8_*, C64).
"""

import hashlib
import json
import os
import struct

STATE_DIR = ".weight_sync"


def read_header(path):
    """(header_len, header dict) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def read_tensors(path):
    """{name: (dtype, shape, raw bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    hdr = json.loads(blob[8 : 8 + n])
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], list(t["shape"]), bytes(blob[8 + n + b : 8 + n + e]))
    return out


def tensor_locations(path):
    """{name: (absolute file offset, nbytes)} of one safetensors file."""
    n, hdr = read_header(path)
    return {
        name: (8 + n + t["data_offsets"][0], t["data_offsets"][1] - t["data_offsets"][0])
        for name, t in hdr.items()
        if name != "__metadata__"
    }


def weight_files(ckpt):
    """Weight files of a checkpoint directory: the files named by its
    *.safetensors.index.json weight maps, or every top-level *.safetensors."""
    indexes = [f for f in sorted(os.listdir(ckpt)) if f.endswith(".safetensors.index.json")]
    if indexes:
        files = set()
        for ix in indexes:
            with open(os.path.join(ckpt, ix)) as f:
                files.update(json.load(f)["weight_map"].values())
        return sorted(files)
    return sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))


def checkpoint_tensors(ckpt):
    """{name: (file, dtype, shape, raw bytes)} over every weight file."""
    out = {}
    for wf in weight_files(ckpt):
        for name, (dt, shape, raw) in read_tensors(os.path.join(ckpt, wf)).items():
            assert name not in out, f"{name} in two weight files"
            out[name] = (wf, dt, shape, raw)
    return out


def checkpoint_locations(ckpt):
    """{name: (file, absolute offset, nbytes)} over every weight file."""
    out = {}
    for wf in weight_files(ckpt):
        for name, (off, nb) in tensor_locations(os.path.join(ckpt, wf)).items():
            out[name] = (wf, off, nb)
    return out


def tree(root, skip_state=True):
    """{relative path: sha256} of every regular file below root."""
    out = {}
    for d, dirs, files in os.walk(root):
        rel_d = os.path.relpath(d, root)
        if skip_state and rel_d == ".":
            dirs[:] = [x for x in dirs if x != STATE_DIR]
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.normpath(os.path.join(rel_d, f))
            with open(p, "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def assert_same_tree(a, b):
    """Every file of a and b (outside .weight_sync) is present in both, byte for byte."""
    ta, tb = tree(a), tree(b)
    assert sorted(ta) == sorted(tb), f"file sets differ: only in {a}: {sorted(set(ta) - set(tb))}, only in {b}: {sorted(set(tb) - set(ta))}"
    diff = [f for f in ta if ta[f] != tb[f]]
    assert not diff, f"files differ between {a} and {b}: {diff}"


def read_state(local):
    p = os.path.join(local, STATE_DIR, "state.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def state_version(local):
    """The version LOCAL's state.json records after a completed apply (a
    recorded `pending` means an apply did not finish)."""
    s = read_state(local)
    assert s is not None, f"{local}: no state.json"
    assert "pending" not in s, f"{local}: state.json still has pending: {s}"
    return s["version"]
