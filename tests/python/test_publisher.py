"""hfdelta.Publisher: publishing from memory against a mirror.

The delta must be byte for byte what delta-diff writes for a save of the same
tensors, for every encoding and whatever the order the tensors come in; the
mirror must end up equal to that save; mistakes are refused before anything is
published; memory must not grow with the model.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import ml_dtypes  # noqa: F401  (bfloat16 for safetensors' numpy loader)
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import files_of

import hfdelta
from hfdelta import Publisher

ENCODINGS = ["sparse", "context", "auto", "xor", "overwrite"]


def tensors_of(save: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in sorted(save.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def shuffled(d: dict[str, Any], seed: int) -> list[tuple[str, Any]]:
    items = list(d.items())
    random.Random(seed).shuffle(items)
    return items



def assert_same_tree(a: Path, b: Path) -> None:
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k] == fb[k], f"{k} differs between {a} and {b}"


def new_mirror(tmp: Path, save: Path) -> tuple[Path, Path]:
    root, mirror = tmp / "root", tmp / "mirror"
    root.mkdir()
    hfdelta.init(save, mirror, sync=False)
    return root, mirror


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_delta_is_delta_diffs_byte_for_byte(tools: Any, series: list[Path], tmp_path: Path, encoding: str) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    ref = tmp_path / "ref"
    ref.mkdir()
    with Publisher(root, mirror, encoding=encoding, sync=False) as pub:
        assert pub.version == 0 and pub.opening.caught_up == []
        for v in (1, 2):
            r = pub.publish(shuffled(tensors_of(series[v]), seed=v), wait=True)
            assert r.version == f"{v:06d}" and r.encoding == encoding
            assert r.tensors_given == r.tensors and r.tensors_declared_unchanged == 0
            assert r.mirror is not None and r.mirror.to_version == f"{v:06d}"
            cli = tools.diff_json("--no-sync", "--encoding", encoding, series[v - 1], series[v], ref)
            assert cli.code == 0, cli.err
            # the same object as the CLI's, but for timing
            want = {k: v for k, v in cli.json.items() if k not in ("seconds", "out")}
            got = {k: v for k, v in r.to_dict().items() if k in want}
            assert got == want
            assert_same_tree(root / f"weight_v{v:06d}", ref / f"weight_v{v:06d}")
        assert pub.version == 2
    assert_same_tree(mirror, series[2])
    assert tools.run("apply", "--verify", mirror).code == 0


def test_dlpack_and_buffer_protocol_inputs(tools: Any, tmp_path: Path) -> None:
    """float32 tensors given as numpy arrays, as DLPack-only objects and as plain buffers: one delta."""
    r = tools.run("gen", "--preset", "tiny", "--saves", 1, "--dtype", "f32", tmp_path / "s")
    assert r.code == 0, r.err
    s0, s1 = tmp_path / "s" / "save_000", tmp_path / "s" / "save_001"
    new = tensors_of(s1)

    class DLPackOnly:  # no buffer protocol: only the DLPack protocol
        def __init__(self, a: Any) -> None:
            self.a = a

        def __dlpack__(self, **kw: Any) -> Any:
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self) -> Any:
            return self.a.__dlpack_device__()

    roots = []
    for kind in ("numpy", "dlpack", "buffer", "strided", "big-endian"):
        d = tmp_path / kind
        d.mkdir()
        root, mirror = new_mirror(d, s0)
        with Publisher(root, mirror, sync=False) as pub:
            if kind == "numpy":
                items = list(new.items())
            elif kind == "dlpack":
                items = [(k, DLPackOnly(a)) for k, a in new.items()]
            elif kind == "buffer":
                items = [(k, memoryview(a)) for k, a in new.items()]
            elif kind == "strided":  # Fortran order: copied to row-major first, one tensor at a time
                items = [(k, np.asfortranarray(a)) for k, a in new.items()]
            else:  # the same values, stored big-endian: converted first
                items = [(k, a.astype(a.dtype.newbyteorder(">"))) for k, a in new.items()]
            pub.publish(items)
        roots.append(root / "weight_v000001")
    ref = tmp_path / "ref"
    ref.mkdir()
    assert tools.run("diff", "-q", "--no-sync", s0, s1, ref).code == 0
    for r_ in roots:
        assert_same_tree(r_, ref / "weight_v000001")


def test_progress_callback(series: list[Path], tmp_path: Path) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    seen: list[tuple[str, int, int]] = []
    with Publisher(root, mirror, sync=False) as pub:
        pub.publish(tensors_of(series[1]), progress=lambda phase, done, total: seen.append((phase, done, total)))
    assert seen and all(p == "publish" for p, _, _ in seen)
    dones = [d for _, d, _ in seen]
    assert dones == sorted(dones) and seen[-1][1] == seen[-1][2] > 0, seen


def test_one_call_at_a_time(series: list[Path], tmp_path: Path) -> None:
    """A call from another thread while a publish runs is refused, and leaves that publish alone."""
    import threading

    root, mirror = new_mirror(tmp_path, series[0])
    new = tensors_of(series[1])
    inside, go_on = threading.Event(), threading.Event()

    def slow() -> Iterator[tuple[str, Any]]:
        for i, item in enumerate(new.items()):
            if i == 1:
                inside.set()
                assert go_on.wait(30)
            yield item

    with Publisher(root, mirror, sync=False) as pub:
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(pub.publish(slow())))
        t.start()
        assert inside.wait(30)
        name, first = next(iter(new.items()))
        for call in (lambda: pub.put(name, first), lambda: pub.publish([]), pub.abort, lambda: pub.version):
            with pytest.raises(hfdelta.UsageError, match="in use by another thread"):
                call()
        go_on.set()
        t.join(30)
        assert result and result[0].tensors_given == len(new) and result[0].version == "000001"


def test_mistakes_publish_nothing(series: list[Path], tmp_path: Path) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    new = tensors_of(series[1])
    name, first = next(iter(new.items()))
    with Publisher(root, mirror, sync=False) as pub:
        with pytest.raises(hfdelta.Unsupported, match="not in mirror") as e:
            pub.publish([("no.such.tensor", first)])
        assert e.value.path is None  # "tensor '...': " names no file
        with pytest.raises(hfdelta.Unsupported, match="publish a changed layout as a full version"):
            pub.publish([(name, first.reshape(-1))])
        with pytest.raises(hfdelta.Unsupported, match="holds it as BF16"):
            pub.publish([(name, np.zeros(first.shape, np.float32))])
        with pytest.raises(hfdelta.UsageError, match="given twice"):
            pub.publish([(name, first), (name, first)])
        with pytest.raises(hfdelta.UsageError, match="neither given nor declared unchanged"):
            pub.publish([(name, first)])

        def failing() -> Iterator[tuple[str, Any]]:
            yield name, first
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            pub.publish(failing())

        class OnDevice:  # a DLPack object in a device's memory
            def __init__(self, device: tuple[int, int]) -> None:
                self.device = device

            def __dlpack__(self, **kw: Any) -> Any:
                raise AssertionError("not to be read")

            def __dlpack_device__(self) -> tuple[int, int]:
                return self.device

        # Neither the host's nor a CUDA device's (kDLROCM): refused by every build.
        with pytest.raises(hfdelta.UsageError, match=f"tensor '{name}': not in host memory nor on a CUDA device"):
            pub.publish([(name, OnDevice((10, 0)))])
        if not hfdelta._core.cuda:  # a CUDA device's, in a build without CUDA: refused, saying so
            with pytest.raises(hfdelta.UsageError, match=f"tensor '{name}': on a CUDA device .*has no CUDA"):
                pub.publish([(name, OnDevice((2, 0)))])
        assert os.listdir(root) == [] and pub.version == 0
        # declared unchanged: not read, no entry
        r = pub.publish([(name, new[name])], unchanged=[k for k in new if k != name])
        assert r.tensors_given == 1 and r.tensors_declared_unchanged == len(new) - 1
        r = pub.publish([], unchanged=True)
        assert r.tensors_changed == 0 and r.version == "000002"
    assert sorted(os.listdir(root)) == ["weight_v000001", "weight_v000002"]


def test_opening_reconciles_or_refuses(tools: Any, series: list[Path], tmp_path: Path) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    for v in (1, 2):  # published by delta-diff: the mirror is behind
        assert tools.run("diff", "-q", "--no-sync", series[v - 1], series[v], root).code == 0
    with Publisher(root, mirror, sync=False) as pub:
        assert pub.opening.caught_up == [1, 2] and pub.version == 2
    assert_same_tree(mirror, series[2])

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(hfdelta.OutOfOrder, match="publishes no version"):
        Publisher(empty, mirror)
    # another root, whose version 2 holds other bytes than the mirror's
    other = tmp_path / "other"
    other.mkdir()
    assert tools.run("diff", "-q", "--no-sync", series[0], series[1], other).code == 0
    assert tools.run("diff", "-q", "--no-sync", series[1], series[3], other).code == 0
    with pytest.raises(hfdelta.VerifyFailed, match="different publishers") as e:
        Publisher(other, mirror)
    assert e.value.path is not None
    # a root behind the mirror
    behind = tmp_path / "behind"
    behind.mkdir()
    assert tools.run("diff", "-q", "--no-sync", series[0], series[1], behind).code == 0
    with pytest.raises(hfdelta.OutOfOrder, match="newest version is 000001"):
        Publisher(behind, mirror)
    with pytest.raises(hfdelta.Uninitialised):
        (tmp_path / "blank").mkdir()
        Publisher(root, tmp_path / "blank")
    # one publisher per mirror
    with Publisher(root, mirror):
        with pytest.raises(hfdelta.LockTimeout):
            Publisher(root, mirror, lock_timeout=0.2)


def every_path(d: Path) -> dict[str, bytes]:
    """Every path below d (.weight_sync/ and its lock files included), with a file's bytes."""
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else b"" for p in sorted(d.rglob("*"))}


def test_wrong_paths_refused_before_anything_is_created(tools: Any, series: list[Path], tmp_path: Path) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    host = tmp_path / "host"
    hfdelta.init(series[0], host, sync=False)
    plain = tmp_path / "plain"
    shutil.copytree(series[0], plain)
    inner = tmp_path / "outer-root" / "mirror"
    inner.parent.mkdir()
    hfdelta.init(series[0], inner, sync=False)
    (mirror / "weights").mkdir()
    before = every_path(tmp_path)
    # swapped: ROOT/.weight_sync/ would strand every host's pull
    with pytest.raises(hfdelta.BadInput, match="swapped") as e:
        Publisher(mirror, root)
    assert e.value.path == str(mirror)
    # a host's LOCAL as the root: weight_v000001 would be written into it
    with pytest.raises(hfdelta.BadInput, match="swapped"):
        Publisher(host, mirror)
    with pytest.raises(hfdelta.BadInput, match="inside mirror"):
        Publisher(mirror / "weights", mirror)
    with pytest.raises(hfdelta.BadInput, match="inside ROOT"):
        Publisher(inner.parent, inner)
    with pytest.raises(hfdelta.Uninitialised, match=r"hfdelta\.init\(checkpoint, "):
        Publisher(root, plain)
    with pytest.raises(hfdelta.UsageError, match="create the publication root first"):
        Publisher(tmp_path / "typo", mirror)
    assert every_path(tmp_path) == before
    # hosts still pull from the root
    assert tools.run("diff", "-q", "--no-sync", series[0], series[1], root).code == 0
    assert hfdelta.pull(root, host, sync=False).to_version == "000001"


def test_numbers_are_checked_as_the_cli_checks_them(tools: Any, series: list[Path], tmp_path: Path) -> None:
    root, mirror = new_mirror(tmp_path, series[0])
    before = every_path(tmp_path)
    for kw in ({"lock_timeout": -1}, {"lock_timeout": -0.5}, {"threads": -1}, {"level": -1}):
        with pytest.raises(hfdelta.UsageError, match="-"):
            Publisher(root, mirror, **kw)
    with pytest.raises(hfdelta.UsageError, match="lock_timeout"):
        hfdelta.status(mirror, lock_timeout=-1)
    with pytest.raises(hfdelta.UsageError, match="target"):
        hfdelta.pull(root, mirror, target=-1)
    with pytest.raises(hfdelta.UsageError, match="keep_from"):
        hfdelta.prune(root, keep_from=-1)
    # the CLI refuses the same, as usage errors
    for args in (("apply", "--status", "--lock-timeout", -1, mirror), ("apply", "--root", root, "--target", -1, mirror),
                 ("apply", "--root", root, "--threads", -1, mirror), ("diff", "--prune", root, "--keep-from", -1)):
        r = tools.run(*args)
        assert r.code == 2, (args, r.err)
    assert every_path(tmp_path) == before
    with Publisher(root, mirror, lock_timeout=None, sync=False) as pub:  # None: wait for ever, as the default
        assert pub.version == 0


def test_overtaken_publisher_is_told_to_reopen(series: list[Path], tmp_path: Path) -> None:
    root, first_mirror = new_mirror(tmp_path, series[0])
    late_mirror = tmp_path / "late-mirror"
    hfdelta.init(series[0], late_mirror, sync=False)
    with Publisher(root, late_mirror, sync=False, background=False) as late:
        with Publisher(root, first_mirror, sync=False, background=False) as first:
            first.publish(tensors_of(series[1]))
        for _ in range(2):  # said on the first call, and on every one after
            with pytest.raises(hfdelta.Exists, match="published by another publisher") as e:
                late.publish(tensors_of(series[2]))
            assert "open it again" in e.value.message and str(late_mirror) in e.value.message
        assert sorted(os.listdir(root)) == ["weight_v000001"]
    with Publisher(root, late_mirror, sync=False) as again:
        assert again.opening.caught_up == [1] and again.version == 1
        assert again.publish(tensors_of(series[2]), wait=True).version == "000002"
    assert_same_tree(late_mirror, series[2])


# The peak is VmHWM, this process's own: ru_maxrss would carry the parent's
# peak over fork and exec.
MEMORY_CHILD = textwrap.dedent("""
    import re, sys, numpy as np, hfdelta
    root, mirror, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    def peak_kib():
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
    before = peak_kib()
    def tensors():
        for i in range(n):  # made one at a time, as a trainer gathers them
            a = np.full(size // 4, i, np.float32)
            a[::97] += 1.0
            yield f"t{i:03d}", a
    with hfdelta.Publisher(root, mirror, sync=False) as pub:
        r = pub.publish(tensors(), wait=True)
    after = peak_kib()
    print(before, after, r.tensors_changed)
""")


def test_memory_does_not_grow_with_the_model(tmp_path: Path) -> None:
    """A 512 MiB model of 32 tensors published with a peak of a few tensors above the interpreter's."""
    from safetensors.numpy import save_file

    n, size = 32, 16 << 20
    base = tmp_path / "base"
    base.mkdir()
    for shard in range(4):  # written a shard at a time
        save_file({f"t{i:03d}": np.full(size // 4, i, np.float32) for i in range(shard * 8, shard * 8 + 8)},
                  str(base / f"model-{shard:05d}.safetensors"))
    root, mirror = new_mirror(tmp_path, base)
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, root, mirror, str(n), str(size)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    before, after, changed = map(int, out.stdout.split())
    assert changed == n
    grown_mib = (after - before) / 1024
    print(f"peak RSS grew {grown_mib:.0f} MiB publishing a {n * size >> 20} MiB model")
    assert grown_mib < 6 * (size >> 20), "memory grew with the model"
