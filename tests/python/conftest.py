"""Fixtures of the Python package's tests: small generated checkpoints, and the
CLIs (delta-diff, delta-apply) of the same build to compare results with.

The CLIs and the generator come from environment variables, as in the e2e
tests: HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN (scripts/ci/python-test.sh sets
them to the meson build's); without them, build/src/delta-diff, build/src/delta-apply and
build/tools/hfdelta-gen of the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool(var: str, name: str, subdir: str = "src") -> str:
    path = os.environ.get(var) or str(REPO / "build" / subdir / name)
    if not os.access(path, os.X_OK):
        pytest.exit(f"{name} not found at {path} (set {var}, or build the CLIs: meson setup build && ninja -C build)",
                    returncode=1)
    return path


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.out)
        return obj


@dataclass
class Tools:
    diff: str
    apply: str
    gen: str

    def run(self, tool: str, *args: object, env: Optional[dict[str, str]] = None) -> CliRun:
        exe = {"diff": self.diff, "apply": self.apply, "gen": self.gen}[tool]
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)
        return CliRun(r.returncode, r.stdout, r.stderr)

    def diff_json(self, *args: object) -> CliRun:
        return self.run("diff", "--json", *args)

    def apply_json(self, *args: object, env: Optional[dict[str, str]] = None) -> CliRun:
        return self.run("apply", "--json", *args, env=env)


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools(_tool("HFDELTA_DIFF", "delta-diff"), _tool("HFDELTA_APPLY", "delta-apply"),
                 _tool("HFDELTA_GEN", "hfdelta-gen", "tools"))


@pytest.fixture(scope="session")
def series(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Saves 0..4 of a tiny generated bf16 training run (about 2 MB each)."""
    d = tmp_path_factory.mktemp("series")
    r = tools.run("gen", "--preset", "tiny", "--saves", 4, "--threads", 2, d / "s")
    assert r.code == 0, r.err
    return [d / "s" / f"save_{i:03d}" for i in range(5)]


@pytest.fixture(scope="session")
def big_pair(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two saves large enough (about 70 MB) that a diff takes a while."""
    d = tmp_path_factory.mktemp("big")
    r = tools.run("gen", "--preset", "small", "--layers", 2, "--saves", 1, "--threads", 2, d / "s")
    assert r.code == 0, r.err
    return d / "s" / "save_000", d / "s" / "save_001"


@pytest.fixture(scope="session")
def published(tools: Tools, series: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A publication root with delta versions 1..4 of the series (made by the CLI); copy it to change it."""
    root = tmp_path_factory.mktemp("published") / "root"
    root.mkdir()
    for v in range(1, 5):
        r = tools.run("diff", "-q", series[v - 1], series[v], root)
        assert r.code == 0, r.err
    return root


def files_of(d: Path) -> dict[str, bytes]:
    """Every file below d but its .weight_sync/, by relative path, with its bytes."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".weight_sync" not in p.parts}


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`d` less keys whose values depend on timing (seconds) or on where it ran."""
    out = dict(d)
    for k in keys:
        out.pop(k, None)
    return out


def replace_paths(obj: Any, old: str, new: str) -> Any:
    """`obj` with every string starting with `old` rewritten to start with `new` instead."""
    if isinstance(obj, str):
        return new + obj[len(old):] if obj.startswith(old) else obj
    if isinstance(obj, list):
        return [replace_paths(x, old, new) for x in obj]
    if isinstance(obj, dict):
        return {k: replace_paths(v, old, new) for k, v in obj.items()}
    return obj


def zero_times(obj: Any) -> Any:
    """`obj` with every number that is not a bool 0 (phase times), None kept."""
    if isinstance(obj, dict):
        return {k: zero_times(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [zero_times(x) for x in obj]
    return 0 if isinstance(obj, (int, float)) and not isinstance(obj, bool) else obj


def strip_seconds(obj: Any) -> Any:
    """`obj` less its timing: "seconds" left out, the "phases" times zeroed (their keys, versions and
    which are null still compared)."""
    if isinstance(obj, dict):
        return {k: zero_times(v) if k == "phases" else strip_seconds(v) for k, v in obj.items() if k != "seconds"}
    if isinstance(obj, list):
        return [strip_seconds(x) for x in obj]
    return obj


@pytest.fixture
def interrupted_local(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> Iterator[Path]:
    """A LOCAL at version 0 whose apply of version 1 was killed half way (its undo journal left)."""
    local = tmp_path / "interrupted"
    r = tools.run("apply", "-q", "--init", series[0], local)
    assert r.code == 0, r.err
    for step in range(1, 200):
        env = dict(os.environ, HFDELTA_FAULT_AT=str(step), HFDELTA_FAULT_MODE="kill")
        r = tools.run("apply", "-q", published / "weight_v000001", local, env=env)
        assert r.code != 0
        txn = local / ".weight_sync" / "txn"
        if txn.is_dir() and any((e / "manifest.json").exists() for e in txn.iterdir()):
            break
    else:
        pytest.fail("no kill step left an interrupted apply")
    yield local
