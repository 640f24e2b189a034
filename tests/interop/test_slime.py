"""The disk-delta layout published by slime, both ways, against a reference
publisher/applier/pull written from the layout's description (slime_ref.py)."""

import json
import os
import shutil
import threading
import time

import pytest
import safetensors

import producers
import slime_ref
import stio

ENCODINGS = ["xor", "overwrite"]


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    """Six successive saves, sharded, with safetensors __metadata__."""
    root = tmp_path_factory.mktemp("saves")
    return producers.series(str(root), 6, seed=21, sharded=True, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def single_saves(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    return producers.series(str(root), 3, seed=22, sharded=False)


def vdir(root, v):
    return os.path.join(str(root), f"weight_v{v:06d}")


# ---------------------------------------------------------------- (a) reference publisher -> delta-apply


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_reference_delta_applied_by_hfdelta(hf, tmp_path, saves, encoding):
    out = vdir(tmp_path, 1)
    index = slime_ref.publish(saves[0], saves[1], out, 1, encoding=encoding)
    # The reference writes the plain layout only.
    assert sorted(os.listdir(out)) == ["model-00000-of-00001.safetensors", "model.safetensors.index.json"]
    assert not any(k.startswith("hfdelta") for k in index["metadata"])
    assert index["metadata"] == {
        "version": "000001", "base_version": "000000", "delta_encoding": encoding,
        "compression_format": "zstd", "checksum_format": "xxh3-128",
    }
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(out, local)
    stio.assert_same_tree(local, saves[1])
    assert stio.state_version(local) == "000001"
    # Applying it again is a no-op (the version is already applied).
    hf.apply(out, local)
    stio.assert_same_tree(local, saves[1])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_reference_chain_pulled_by_hfdelta(hf, tmp_path, saves, encoding):
    root = tmp_path / "root"
    root.mkdir()
    for v in range(1, 6):
        slime_ref.publish(saves[v - 1], saves[v], vdir(root, v), v, encoding=encoding)
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply("--root", str(root), "--target", "3", local)
    stio.assert_same_tree(local, saves[3])
    hf.apply("--root", str(root), local)
    stio.assert_same_tree(local, saves[5])
    assert stio.state_version(local) == "000005"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_reference_adler32_chain_pulled_by_hfdelta(hf, tmp_path, saves, encoding):
    """miles' --update-weight-delta-checksum adler32: the checksums checked, LOCAL
    byte for byte the last save, its checksum record good for --verify; a LOCAL
    that is not the base (xor) refused by the Adler-32 (exit 5)."""
    root = tmp_path / "root"
    root.mkdir()
    for v in range(1, 4):
        index = slime_ref.publish(saves[v - 1], saves[v], vdir(root, v), v, encoding=encoding,
                                  checksum_format="adler32")
        assert index["metadata"]["checksum_format"] == "adler32"
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply("--root", str(root), local)
    stio.assert_same_tree(local, saves[3])
    hf.apply("--verify", local)
    inspected = json.loads(hf.run([hf.diff_bin, "--inspect", "--json", vdir(root, 1)]).stdout)
    assert inspected["checksum_format"] == "adler32"
    assert all(len(t["checksum"]) == 8 for t in inspected["tensors"])
    if encoding == "xor":  # overwrite sets the new bytes whatever the base: nothing to catch
        bad = str(tmp_path / "bad")
        hf.init(saves[2], bad)  # claims version 0, holds save 2
        hf.apply(vdir(root, 1), bad, expect=5)
        stio.assert_same_tree(bad, saves[2])


def test_reference_blake3_refused_naming_the_setting(hf, tmp_path, saves):
    out = vdir(tmp_path, 1)
    slime_ref.publish(saves[0], saves[1], out, 1, encoding="xor")
    index_path = os.path.join(out, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["metadata"]["checksum_format"] = "blake3"
    with open(index_path, "w") as f:
        json.dump(index, f)
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    r = hf.apply(out, local, expect=6)
    assert "--update-weight-delta-checksum xxh3-128" in r.stderr
    stio.assert_same_tree(local, saves[0])


def test_reference_delta_out_of_order_and_corrupt(hf, tmp_path, saves):
    root = tmp_path / "root"
    root.mkdir()
    slime_ref.publish(saves[0], saves[1], vdir(root, 1), 1, encoding="xor")
    slime_ref.publish(saves[1], saves[2], vdir(root, 2), 2, encoding="xor")
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    hf.apply(vdir(root, 2), local, expect=4)  # base 1, LOCAL at 0
    stio.assert_same_tree(local, saves[0])
    # A reference delta has no base checksums: a LOCAL that is not the base is
    # caught after patching, by the new-bytes checksum (exit 5).
    bad = str(tmp_path / "bad")
    hf.init(saves[2], bad)
    hf.apply(vdir(root, 1), bad, expect=5)


# ---------------------------------------------------------------- (b) delta-diff -> reference applier


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_hfdelta_delta_applied_by_reference(hf, tmp_path, saves, encoding):
    root = tmp_path / "root"
    root.mkdir()
    for v in range(1, 4):
        hf.diff(saves[v - 1], saves[v], vdir(root, v), encoding)
    local = str(tmp_path / "local")
    slime_ref.init(saves[0], local, 0)
    for v in range(1, 4):
        assert slime_ref.apply(vdir(root, v), local) == "applied"
        stio.assert_same_tree(local, saves[v])
        assert stio.state_version(local) == f"{v:06d}"
    # Already applied: no-op; out of order: refused.
    assert slime_ref.apply(vdir(root, 3), local) == "noop"
    with pytest.raises(slime_ref.OutOfOrder):
        slime_ref.apply(vdir(root, 2), local)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_hfdelta_delta_single_file_by_reference(hf, tmp_path, single_saves, encoding):
    out = vdir(tmp_path, 1)
    hf.diff(single_saves[0], single_saves[1], out, encoding)
    local = str(tmp_path / "local")
    slime_ref.init(single_saves[0], local, 0)
    slime_ref.apply(out, local)
    stio.assert_same_tree(local, single_saves[1])


def test_reference_applier_verifies_hfdelta_checksums(hf, tmp_path, saves):
    """The reference applier's checksum check is live on hfdelta's deltas: a
    LOCAL that is not the base fails verification with an xor delta."""
    out = vdir(tmp_path, 1)
    hf.diff(saves[0], saves[1], out, "xor")
    local = str(tmp_path / "local")
    slime_ref.init(saves[2], local, 0)
    with pytest.raises(slime_ref.VerifyFailed):
        slime_ref.apply(out, local)


def test_reference_applier_ignores_hfdelta_files(hf, tmp_path, single_saves):
    """A delta carrying a changed config.json (hfdelta_files, files/): a plain
    reader applies the weights and leaves non-weight files alone, as documented."""
    new = str(tmp_path / "new")
    shutil.copytree(single_saves[1], new)
    with open(os.path.join(new, "config.json"), "w") as f:
        f.write('{"changed": true}\n')
    with open(os.path.join(new, "generation_config.json"), "w") as f:
        f.write('{"temperature": 0.7}\n')
    out = vdir(tmp_path, 1)
    hf.diff(single_saves[0], new, out, "xor")
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        m = json.load(f)["metadata"]
    assert sorted(e["path"] for e in m["hfdelta_files"]) == ["config.json", "generation_config.json"]
    ref_local = str(tmp_path / "ref_local")
    slime_ref.init(single_saves[0], ref_local)
    slime_ref.apply(out, ref_local)
    assert stio.checkpoint_tensors(ref_local) == stio.checkpoint_tensors(new)
    with open(os.path.join(ref_local, "config.json")) as f:
        assert "changed" not in f.read()
    hf_local = str(tmp_path / "hf_local")
    hf.init(single_saves[0], hf_local)
    hf.apply(out, hf_local)
    stio.assert_same_tree(hf_local, new)


def test_reference_applier_respects_hfdelta_lock(hf, tmp_path, saves):
    """Both sides use the same flock: while the reference applier holds
    LOCAL/.weight_sync/lock, delta-apply --lock-timeout gives up (exit 8)."""
    root = tmp_path / "root"
    root.mkdir()
    hf.diff(saves[0], saves[1], vdir(root, 1))
    local = str(tmp_path / "local")
    slime_ref.init(saves[0], local)
    with slime_ref._Lock(local):
        hf.apply("--lock-timeout", "0.3", vdir(root, 1), local, expect=8)
    hf.apply("--lock-timeout", "5", vdir(root, 1), local)
    stio.assert_same_tree(local, saves[1])

    # And the other way: the reference waits while delta-apply holds the lock.
    hf.diff(saves[1], saves[2], vdir(root, 2))
    import fcntl

    held = threading.Event()
    done = {}

    def reference():
        held.wait()
        done["t0"] = time.monotonic()
        done["r"] = slime_ref.apply(vdir(root, 2), local)
        done["t1"] = time.monotonic()

    th = threading.Thread(target=reference)
    th.start()
    # Hold the lock the way delta-apply does (an flock on the same file) from
    # this process for a moment, then let go.
    with open(os.path.join(local, ".weight_sync", "lock"), "a+") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        held.set()
        time.sleep(0.3)
        assert "r" not in done
        fcntl.flock(lf, fcntl.LOCK_UN)
    th.join(10)
    assert done["r"] == "applied"
    stio.assert_same_tree(local, saves[2])


# ---------------------------------------------------------------- (c) one LOCAL, both appliers


@pytest.mark.parametrize("first", ["hfdelta", "reference"])
@pytest.mark.parametrize("publisher", ["hfdelta", "reference", "mixed"])
def test_local_continued_across_appliers(hf, tmp_path, saves, first, publisher):
    """Versions 1..5 applied alternately by delta-apply and the reference
    applier on the same LOCAL (same .weight_sync/state.json)."""
    root = tmp_path / "root"
    root.mkdir()
    encs = ["xor", "overwrite", "xor", "overwrite", "xor"]
    for v in range(1, 6):
        by = publisher if publisher != "mixed" else ("hfdelta" if v % 2 else "reference")
        if by == "hfdelta":
            hf.diff(saves[v - 1], saves[v], vdir(root, v), encs[v - 1])
        else:
            slime_ref.publish(saves[v - 1], saves[v], vdir(root, v), v, encoding=encs[v - 1])
    local = str(tmp_path / "local")
    order = ["hfdelta", "reference"] if first == "hfdelta" else ["reference", "hfdelta"]
    if order[0] == "hfdelta":
        hf.init(saves[0], local)
    else:
        slime_ref.init(saves[0], local)
    for v in range(1, 6):
        who = order[(v - 1) % 2]
        if who == "hfdelta":
            hf.apply(vdir(root, v), local)
        else:
            assert slime_ref.apply(vdir(root, v), local) == "applied"
        stio.assert_same_tree(local, saves[v])
        assert stio.state_version(local) == f"{v:06d}"
    # The other side sees the version as applied (no-op, nothing changes).
    hf.apply(vdir(root, 5), local)
    assert slime_ref.apply(vdir(root, 5), local) == "noop"
    stio.assert_same_tree(local, saves[5])


def test_pull_continued_across_appliers(hf, tmp_path, saves):
    root = tmp_path / "root"
    root.mkdir()
    for v in range(1, 6):
        hf.diff(saves[v - 1], saves[v], vdir(root, v), "overwrite" if v % 2 else "xor")
    local = str(tmp_path / "local")
    hf.init(saves[0], local)
    assert slime_ref.pull(str(root), local, 2) == [1, 2]
    hf.apply("--root", str(root), "--target", "4", local)
    stio.assert_same_tree(local, saves[4])
    assert slime_ref.pull(str(root), local) == [5]
    stio.assert_same_tree(local, saves[5])
    hf.apply("--root", str(root), local)  # nothing left
    assert stio.state_version(local) == "000005"


# ---------------------------------------------------------------- (d) pull agreement


def _pull_both(hf, tmp_path, root, start, target, tag):
    """Runs the reference pull and delta-apply --root from the same start;
    returns (reference outcome, hfdelta exit code, the two LOCALs)."""
    ref_local = str(tmp_path / f"{tag}_ref")
    hf_local = str(tmp_path / f"{tag}_hf")
    for loc in (ref_local, hf_local):
        os.makedirs(loc)
        if start is not None:
            src, v = start
            if loc == ref_local:
                slime_ref.init(src, loc, v)
            else:
                hf.init(src, loc, v)
    try:
        slime_ref.pull(str(root), ref_local, target)
        ref = "ok"
    except slime_ref.OutOfOrder:
        ref = "out_of_order"
    args = ["--root", str(root)] + (["--target", str(target)] if target is not None else []) + [hf_local]
    code = hf.apply(*args, expect=None).returncode
    return ref, code, ref_local, hf_local


def test_pull_agreement(hf, tmp_path, saves):
    """A root with deltas from both publishers and a full version at 3."""
    root = tmp_path / "root"
    root.mkdir()
    slime_ref.publish(saves[0], saves[1], vdir(root, 1), 1, encoding="xor")
    hf.diff(saves[1], saves[2], vdir(root, 2), "overwrite")
    slime_ref.publish_full(saves[3], str(root), 3)
    hf.diff(saves[3], saves[4], vdir(root, 4), "xor")
    slime_ref.publish(saves[4], saves[5], vdir(root, 5), 5, encoding="overwrite")
    # Leftovers of a publication in progress are ignored by both.
    os.makedirs(os.path.join(root, ".weight_v000006.tmp"))
    os.makedirs(os.path.join(root, "weight_v6"))

    cases = [
        # (start (src, version) or None for a new LOCAL, target, expected save or None for refusal)
        (None, None, 5),          # new LOCAL: from the full version 3
        (None, 3, 3),
        (None, 4, 4),
        (None, 2, None),          # new LOCAL, no full version at or below 2
        ((saves[0], 0), 2, 2),    # deltas only
        ((saves[0], 0), None, 5),  # full version 3 resets, then 4, 5
        ((saves[1], 1), 4, 4),
        ((saves[3], 3), None, 5),  # at the full version: deltas only
        ((saves[4], 4), 4, 4),     # nothing to do
        ((saves[5], 5), 2, None),  # target older than LOCAL
    ]
    for i, (start, target, want) in enumerate(cases):
        ref, code, ref_local, hf_local = _pull_both(hf, tmp_path, root, start, target, f"c{i}")
        if want is None:
            assert ref == "out_of_order" and code == 4, (i, ref, code)
            continue
        assert ref == "ok" and code == 0, (i, ref, code)
        stio.assert_same_tree(ref_local, saves[want])
        stio.assert_same_tree(hf_local, saves[want])
        assert stio.state_version(ref_local) == stio.state_version(hf_local) == f"{want:06d}"


def test_pull_agreement_full_version_replaces_extra_files(hf, tmp_path, saves):
    """A full version makes LOCAL an exact copy: files LOCAL has and the full
    version lacks are removed by both; .weight_sync is kept."""
    root = tmp_path / "root"
    root.mkdir()
    slime_ref.publish_full(saves[2], str(root), 1)
    ref_local, hf_local = str(tmp_path / "ref"), str(tmp_path / "hf")
    for loc in (ref_local, hf_local):
        shutil.copytree(saves[0], loc)
        with open(os.path.join(loc, "stale.txt"), "w") as f:
            f.write("left over")
    slime_ref.pull(str(root), ref_local)
    hf.apply("--root", str(root), hf_local)
    for loc in (ref_local, hf_local):
        stio.assert_same_tree(loc, vdir(root, 1))
        assert stio.state_version(loc) == "000001"


def test_pull_agreement_missing_version(hf, tmp_path, saves):
    root = tmp_path / "root"
    root.mkdir()
    hf.diff(saves[0], saves[1], vdir(root, 1))
    slime_ref.publish(saves[2], saves[3], vdir(root, 3), 3)
    ref, code, ref_local, hf_local = _pull_both(hf, tmp_path, root, (saves[0], 0), None, "gap")
    assert ref == "out_of_order" and code == 4


def test_delta_files_are_plain_checkpoints(hf, tmp_path, saves):
    """A version directory is itself a canonical checkpoint directory: the
    library opens every weight file named by its index."""
    hf.diff(saves[0], saves[1], vdir(tmp_path, 1), "overwrite")
    d = vdir(tmp_path, 1)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    for fname in set(index["weight_map"].values()):
        with safetensors.safe_open(os.path.join(d, fname), framework="numpy") as st:
            assert set(st.keys()) == {t for t, f in index["weight_map"].items() if f == fname}
