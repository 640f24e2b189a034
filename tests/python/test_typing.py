"""The package's annotations hold: a small typed script passes mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = '''
from pathlib import Path
from typing import Optional

import hfdelta
from hfdelta.results import DiffEntries


def publish(base: Path, new: Path, root: Path) -> str:
    r: hfdelta.DiffResult = hfdelta.diff(base, new, root, encoding="sparse", level=3, threads=0,
                                         progress=lambda phase, done, total: None)
    entries: DiffEntries = r.entries
    n: int = entries["sparse"] + r.structure["tensors_new"]
    density: float = r.density
    return r.out + str(n + int(density))


def host(root: str, local: Path) -> Optional[str]:
    def reload(version: int) -> None:
        print(version)
    try:
        r: hfdelta.PullResult = hfdelta.pull(root, local, target=None, then=reload, lock_timeout=2.5)
    except hfdelta.ThenFailed as e:
        assert e.result is not None
        return e.result.to_version
    except hfdelta.HfdeltaError as e:
        code: int = e.exit_code
        path: Optional[str] = e.path
        print(code, path, e.kind, e.message)
        return None
    behind: int = r.behind
    s = hfdelta.status(local)
    v = hfdelta.verify(local, threads=2)
    problems: list[str] = v.problems
    print(behind, s.state, s.exit_code, problems, v.to_dict()["ok"])
    return r.to_version


def upkeep(root: Path, first: Path, last: Path) -> int:
    q = hfdelta.squash(first, last, root / "squashed", base=Path("/models/base"))
    p = hfdelta.prune(root, keep_from=3, dry_run=True)
    i = hfdelta.inspect(q.out)
    f = hfdelta.publish_full(last, root, base=first)
    c = hfdelta.init(first, root / "l", version=0, force=False)
    a = hfdelta.apply(q.out, root / "l")
    rec = hfdelta.recover(root / "l")
    return len(p.removed) + len(i.tensors) + f.files + len(c.applied) + a.tensors_patched + len(rec.applied)


def trainer(root: Path, mirror: Path, weights: dict[str, object]) -> int:
    with hfdelta.Publisher(root, mirror, encoding="auto", lock_timeout=1.0) as pub:
        start: int = pub.version + pub.opening.version + len(pub.opening.caught_up)
        r: hfdelta.PublishResult = pub.publish(weights, unchanged=["lm_head.weight"], wait=True)
        m: Optional[hfdelta.ChangeResult] = r.mirror
        pub.begin()
        for name, t in weights.items():
            pub.put(name, t)
        r2 = pub.commit(rest_unchanged=True)
        w: Optional[hfdelta.ChangeResult] = pub.wait()
        return start + r.tensors_given + r2.tensors_declared_unchanged + (m.tensors_patched if m else 0) + (
            1 if w else 0)


print(hfdelta.__version__.upper())
'''


def test_mypy_strict(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    script = tmp_path / "typed_use.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", str(tmp_path / ".mypy_cache"), str(script)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_package(tmp_path: Path) -> None:
    # The package itself, as installed, with its stubs and py.typed.
    pytest.importorskip("mypy")
    import hfdelta
    pkg = Path(hfdelta.__file__).parent
    assert (pkg / "py.typed").exists() and (pkg / "_core.pyi").exists()
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", str(tmp_path / ".mypy_cache"), "-p", "hfdelta"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
