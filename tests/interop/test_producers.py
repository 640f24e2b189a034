"""Checkpoints written by the safetensors library itself: delta-diff followed by
delta-apply reproduces the second save byte for byte, with both encodings."""

import json
import os

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import producers
import stio

ENCODINGS = ["xor", "overwrite"]


def roundtrip(hf, tmp_path, base, new, encoding, version=1):
    out = str(tmp_path / f"weight_v{version:06d}")
    hf.diff(base, new, out, encoding)
    local = str(tmp_path / "local")
    hf.init(base, local, version - 1)
    hf.apply(out, local)
    stio.assert_same_tree(local, new)
    assert stio.state_version(local) == f"{version:06d}"
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("metadata", [None, {"format": "np"}], ids=["nometa", "meta"])
def test_every_numpy_dtype(hf, tmp_path, encoding, metadata):
    """One file with every dtype safetensors.numpy writes (scalars, empty tensors,
    dtypes hfdelta does not know); the second save changes every non-empty tensor
    in a few bytes, but not the layout."""
    t0 = producers.all_dtypes_tensors(seed=1)
    t1 = {}
    rng = np.random.default_rng(2)
    for name, a in t0.items():
        b = a.copy()
        if b.size and not name.startswith("i64"):  # i64 tensors stay as they were
            u8 = b.reshape(-1).view(np.uint8)
            if name.startswith("bool"):
                u8[0] ^= 1
            else:
                u8[rng.integers(0, u8.size)] ^= 0x01
        t1[name] = b
    base, new = tmp_path / "base", tmp_path / "new"
    producers.save_single(t0, str(base), metadata=metadata)
    producers.save_single(t1, str(new), metadata=metadata)
    hdr = stio.read_header(str(base / "model.safetensors"))[1]
    assert ("__metadata__" in hdr) == (metadata is not None)
    for st in producers.NUMPY_DTYPES:
        assert any(v.get("dtype") == st for k, v in hdr.items() if k != "__metadata__"), st
    out = roundtrip(hf, tmp_path, str(base), str(new), encoding)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    assert not any(n.startswith("i64") or n.endswith(".empty") for n in wm)
    assert "c64.matrix" in wm and "f8_e4m3fnuz.scalar" in wm and "bool.scalar" in wm


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}], ids=["nometa", "meta"])
def test_successive_saves(hf, tmp_path, encoding, sharded, metadata):
    """Model-like saves: ~1% sparse bf16 changes, one fully changed tensor,
    unchanged tensors; a chain of three saves through one LOCAL."""
    saves = producers.series(str(tmp_path / "saves"), 3, seed=11, sharded=sharded, metadata=metadata)
    root = tmp_path / "root"
    root.mkdir()
    for v in (1, 2):
        hf.diff(saves[v - 1], saves[v], str(root / f"weight_v{v:06d}"), encoding)
    with open(root / "weight_v000001" / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    assert "layers.0.norm.weight" in wm and "embed.weight" in wm
    assert "position_ids" not in wm and "unknown.c64" not in wm and "head.scale" not in wm
    if sharded:  # one delta file per changed weight file
        assert len(set(wm.values())) == 3
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(str(root / "weight_v000001"), local)
    stio.assert_same_tree(local, saves[1])
    hf.apply(str(root / "weight_v000002"), local)
    stio.assert_same_tree(local, saves[2])
    # The same through a pull from the root, onto a fresh LOCAL.
    local2 = str(tmp_path / "local2")
    hf.init(saves[0], local2)
    hf.apply("--root", str(root), local2)
    stio.assert_same_tree(local2, saves[2])
    # And the result still loads with the library.
    for wf in stio.weight_files(local2):
        with safetensors.safe_open(os.path.join(local2, wf), framework="numpy") as f:
            assert f.keys()


def test_density_of_sparse_bf16(hf, tmp_path):
    """The sparse bf16 tensors really change in about 1% of their elements, and
    delta-diff counts them so."""
    saves = producers.series(str(tmp_path / "saves"), 2, seed=5, sharded=False)
    p = hf.run([hf.diff_bin, "--json", saves[0], saves[1], str(tmp_path / "weight_v000001")])
    s = json.loads(p.stdout)
    old, new = stio.checkpoint_tensors(saves[0]), stio.checkpoint_tensors(saves[1])
    changed = [n for n in new if new[n][3] != old[n][3]]
    assert s["tensors_changed"] == len(changed)
    assert s["tensors"] == len(new)
    emb_o = np.frombuffer(old["embed.weight"][3], np.uint16)
    emb_n = np.frombuffer(new["embed.weight"][3], np.uint16)
    assert abs((emb_o != emb_n).mean() - 0.01) < 0.002
    assert 0 < s["density"] < 0.2


def test_unchanged_save(hf, tmp_path):
    """Two identical saves: a delta with no entries, still a valid version."""
    saves = producers.series(str(tmp_path / "saves"), 1, seed=3, sharded=True)
    out = str(tmp_path / "weight_v000001")
    hf.diff(saves[0], saves[0], out)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        assert json.load(f)["weight_map"] == {}
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(out, local)
    stio.assert_same_tree(local, saves[0])
    assert stio.state_version(local) == "000001"


def test_library_loads_patched_file(hf, tmp_path):
    """safetensors.numpy loads the patched file to the same arrays as the save
    (for the dtypes it can load back)."""
    saves = producers.series(str(tmp_path / "saves"), 2, seed=9, sharded=False)
    out = roundtrip(hf, tmp_path, saves[0], saves[1], "overwrite")
    assert os.path.isdir(out)
    loadable = {"F64", "F32", "F16", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8", "BOOL", "C64"}
    hdr = stio.read_header(os.path.join(saves[1], "model.safetensors"))[1]
    with safetensors.safe_open(os.path.join(tmp_path, "local", "model.safetensors"), framework="numpy") as a, \
         safetensors.safe_open(os.path.join(saves[1], "model.safetensors"), framework="numpy") as b:
        for name in b.keys():
            if hdr[name]["dtype"] in loadable:
                np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name))


def writer_metadata_orders(metadata, tries=20):
    """Distinct header bytes safetensors writes for the same tensors and metadata."""
    t = {"w": np.zeros((2,), dtype=np.float32)}
    return {safetensors.numpy.save(t, metadata=metadata)[:200] for _ in range(tries)}


MANY_KEYS = {f"key{i}": f"value{i}" for i in range(8)}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_metadata_with_several_keys(hf, tmp_path, encoding):
    """Two saves with the same tensors, shapes, dtypes and the same
    __metadata__ (several keys) by safetensors.numpy.save_file.

    The library serialises __metadata__ from a hash map, so the order of its
    keys, and with it the header bytes, differ from one save to the next
    although nothing structural changed (shown by writer_metadata_orders).
    The header keeps its length and byte ranges, so delta-diff rewrites it in
    place (a "header" operation) and the round trip reproduces the second save
    byte for byte, as for single-key metadata."""
    assert len(writer_metadata_orders(MANY_KEYS)) > 1, "writer is deterministic here"
    saves = producers.series(str(tmp_path / "saves"), 2, seed=31, sharded=False, metadata=MANY_KEYS)
    h0 = stio.read_header(os.path.join(saves[0], "model.safetensors"))[1]
    h1 = stio.read_header(os.path.join(saves[1], "model.safetensors"))[1]
    assert h0 == h1  # the same header, as JSON
    out = roundtrip(hf, tmp_path, saves[0], saves[1], encoding)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        ops = {s["op"] for s in json.load(f)["metadata"].get("hfdelta_shards", [])}
    assert ops <= {"header"}, f"the file was rebuilt instead of its header rewritten in place: {ops}"
