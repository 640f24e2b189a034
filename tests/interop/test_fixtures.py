"""The fixtures in testdata/: regenerated deterministically, and the committed
slime-style deltas applied by the commands."""

import json
import os
import subprocess
import sys

import pytest
import safetensors

import conftest
import slime_ref
import stio

TD = conftest.TESTDATA


def test_fixtures_regenerate_identically():
    p = subprocess.run([sys.executable, os.path.join(TD, "make_fixtures.py"), "--check", "--out", TD],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_manifest_matches_files():
    with open(os.path.join(TD, "MANIFEST.json")) as f:
        m = json.load(f)
    for rel, want in m["files"].items():
        path = os.path.join(TD, rel)
        assert os.path.getsize(path) == want["size"], rel
        with safetensors.safe_open(path, framework="numpy") as st:
            assert (st.metadata() or None) == want["metadata"], rel
            assert sorted(st.keys()) == sorted(want["tensors"]), rel


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_fixture_deltas_with_commands(hf, tmp_path, encoding):
    base, new = os.path.join(TD, "checkpoint", "base"), os.path.join(TD, "checkpoint", "new")
    local = str(tmp_path / "local")
    hf.init(base, local)
    hf.apply(os.path.join(TD, "slime", encoding), local)
    stio.assert_same_tree(local, new)
    # delta-diff between the same pair writes the same changes (other level, hfdelta keys).
    out = str(tmp_path / "weight_v000001")
    hf.diff(base, new, out, encoding)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        mine = json.load(f)
    with open(os.path.join(TD, "slime", encoding, "model.safetensors.index.json")) as f:
        ref = json.load(f)
    assert sorted(mine["weight_map"]) == sorted(ref["weight_map"])
    for k, v in ref["metadata"].items():
        assert mine["metadata"][k] == v


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_fixture_deltas_with_reference(tmp_path, encoding):
    local = str(tmp_path / "local")
    slime_ref.init(os.path.join(TD, "checkpoint", "base"), local)
    slime_ref.apply(os.path.join(TD, "slime", encoding), local)
    stio.assert_same_tree(local, os.path.join(TD, "checkpoint", "new"))
