"""A Hugging Face hub cache as huggingface_hub itself reads it: the layout
the end-to-end tests build by hand (tests/e2e_links.cpp) is checked here with
huggingface_hub's own cache scanner and lookup, then used as hfdelta's SRC,
BASE and NEW."""

import hashlib
import os
import shutil

import pytest

import producers

huggingface_hub = pytest.importorskip("huggingface_hub")

REPO_ID = "hfdelta/tiny"


def make_cache(cache, saves):
    """blobs/<sha256 or sha1>, refs/main, snapshots/<commit>/<file> -> ../../blobs/<hash>."""
    repo = os.path.join(cache, "models--" + REPO_ID.replace("/", "--"))
    snaps = []
    commit = None
    for r, save in enumerate(saves):
        commit = hashlib.sha1(f"revision {r}".encode()).hexdigest()
        snap = os.path.join(repo, "snapshots", commit)
        for dirpath, _, files in os.walk(save):
            for f in files:
                src = os.path.join(dirpath, f)
                rel = os.path.relpath(src, save)
                data = open(src, "rb").read()
                blob = (hashlib.sha256 if f.endswith(".safetensors") else hashlib.sha1)(data).hexdigest()
                os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
                with open(os.path.join(repo, "blobs", blob), "wb") as out:
                    out.write(data)
                link = os.path.join(snap, rel)
                os.makedirs(os.path.dirname(link), exist_ok=True)
                up = os.path.relpath(os.path.join(repo, "blobs", blob), os.path.dirname(link))
                os.symlink(up, link)
        snaps.append(snap)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snaps


def same_tree(a, b):
    def files(d):
        return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs
                      if ".weight_sync" not in p)
    assert files(a) == files(b)
    for f in files(a):
        assert open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read(), f


def test_hub_cache_snapshots_as_sources(hf, tmp_path):
    saves = producers.series(str(tmp_path / "saves"), 2, seed=31, sharded=True, metadata={"format": "pt"})
    cache = str(tmp_path / "hub")
    snaps = make_cache(cache, saves)

    # huggingface_hub reads the layout as its own.
    info = huggingface_hub.scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO_ID and len(repo.revisions) == 2
    main = next(r for r in repo.revisions if "main" in r.refs)
    assert str(main.snapshot_path) == snaps[1]
    found = huggingface_hub.try_to_load_from_cache(REPO_ID, "config.json", cache_dir=cache)
    assert found == os.path.join(snaps[1], "config.json")

    local = str(tmp_path / "local")
    hf.init(snaps[0], local)
    same_tree(local, saves[0])
    assert not any(os.path.islink(os.path.join(p, f)) for p, _, fs in os.walk(local) for f in fs)

    root = tmp_path / "root"
    root.mkdir()
    out = str(root / "weight_v000001")
    hf.diff(snaps[0], snaps[1], out, encoding="xor")
    hf.apply(out, local)
    same_tree(local, saves[1])

    # The cache is still what huggingface_hub wrote.
    again = huggingface_hub.scan_cache_dir(cache)
    assert not again.warnings and again.size_on_disk == info.size_on_disk
