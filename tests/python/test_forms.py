"""Every form of the Python API against the CLI's --json output for the same operation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import hfdelta
from hfdelta import results

from conftest import Tools, copy_tree, files_of, replace_paths, strip_seconds


def same(py: Any, cli: dict[str, Any], cli_base: Path | None = None, py_base: Path | None = None) -> None:
    """`py`'s to_dict() has exactly the CLI object's keys, and the same values but for timing (and the
    paths under `cli_base`, which are `py_base`'s)."""
    d = py.to_dict()
    assert set(d) == set(cli), f"keys differ: only py {set(d) - set(cli)}, only CLI {set(cli) - set(d)}"
    if cli_base is not None and py_base is not None:
        cli = replace_paths(cli, str(cli_base), str(py_base))
    assert strip_seconds(d) == strip_seconds(cli)


def test_version() -> None:
    assert hfdelta.__version__ == "0.2.0"


# ---- delta-diff ----

def test_diff_into_root(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    py_root, cli_root = tmp_path / "py", tmp_path / "cli"
    py_root.mkdir(), cli_root.mkdir()
    r = hfdelta.diff(series[0], series[1], py_root)  # ROOT: its newest version + 1
    assert isinstance(r, hfdelta.DiffResult)
    assert r.out == str(py_root / "weight_v000001") and r.version == "000001" and r.base_version == "000000"
    assert r.ok and r.schema == 1 and r.tensors_changed > 0
    cli = tools.diff_json(series[0], series[1], cli_root)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_root, py_root)
    # The next one, named, with options, as the CLI takes them.
    r2 = hfdelta.diff(str(series[1]), str(series[2]), py_root / "weight_v000002", encoding="auto", level=5, threads=1,
                      sync=False)
    cli2 = tools.diff_json("--encoding", "auto", "--level", 5, "--threads", 1, "--no-sync", series[1], series[2],
                           cli_root / "weight_v000002")
    assert cli2.code == 0, cli2.err
    same(r2, cli2.json, cli_root, py_root)
    assert r2.encoding == "auto"


def test_diff_outside_a_root(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    r = hfdelta.diff(series[1], series[2], tmp_path / "py", delta_version=7, base_version=5)
    cli = tools.diff_json("--delta-version", 7, "--base-version", 5, series[1], series[2], tmp_path / "cli")
    assert cli.code == 0, cli.err
    same(r, cli.json, tmp_path / "cli", tmp_path / "py")
    assert (r.version, r.base_version) == ("000007", "000005")


def test_publish_full(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    py_root, cli_root = tmp_path / "py", tmp_path / "cli"
    py_root.mkdir(), cli_root.mkdir()
    r = hfdelta.publish_full(series[1], py_root)
    cli = tools.diff_json("--full", series[1], cli_root)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_root, py_root)
    assert r.full and r.sidecar is None and r.version == "000001" and r.out == str(py_root / "weight_v000001")
    # With BASE: the delta beside the full version first.
    r = hfdelta.publish_full(series[2], py_root, base=series[1])
    cli = tools.diff_json("--full", series[1], series[2], cli_root)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_root, py_root)
    assert r.sidecar is not None and r.sidecar["out"] == str(py_root / "delta_v000002")


def test_squash(tools: Tools, published: Path, tmp_path: Path) -> None:
    r = hfdelta.squash(published / "weight_v000001", published / "weight_v000003", tmp_path / "py")
    cli = tools.diff_json("--squash", published / "weight_v000001", published / "weight_v000003", tmp_path / "cli")
    assert cli.code == 0, cli.err
    same(r, cli.json, tmp_path / "cli", tmp_path / "py")
    assert (r.version, r.base_version, r.deltas) == ("000003", "000000", 3)


def test_squash_base(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    # A chain of context deltas: its entries stay stacked parts, or with base (--squash-base) compose into one
    # context entry per tensor.
    root = tmp_path / "root"
    root.mkdir()
    for v in range(1, 4):
        assert tools.run("diff", "-q", "--no-sync", "--encoding", "context", series[v - 1], series[v], root).code == 0
    first, last = root / "weight_v000001", root / "weight_v000003"
    plain = hfdelta.squash(first, last, tmp_path / "plain", sync=False)
    assert plain.entries_stacked == plain.entries > 0
    r = hfdelta.squash(first, last, tmp_path / "py", base=series[0], level=5, sync=False)
    cli = tools.diff_json("--squash", "--squash-base", series[0], "--level", 5, "--no-sync", first, last, tmp_path / "cli")
    assert cli.code == 0, cli.err
    same(r, cli.json, tmp_path / "cli", tmp_path / "py")
    assert r.entries_stacked == 0 and r.entries_composed == r.entries == plain.entries
    assert r.delta_bytes < plain.delta_bytes
    assert files_of(tmp_path / "py") == files_of(tmp_path / "cli")
    # Not the chain's first base: VerifyFailed, nothing written.
    with pytest.raises(hfdelta.VerifyFailed) as e:
        hfdelta.squash(first, last, tmp_path / "wrong", base=series[1])
    assert e.value.exit_code == 5 and str(series[1]) in e.value.message
    assert not (tmp_path / "wrong").exists()


def test_inspect(tools: Tools, published: Path) -> None:
    r = hfdelta.inspect(published / "weight_v000002")
    cli = tools.diff_json("--inspect", published / "weight_v000002")
    assert cli.code == 0, cli.err
    same(r, cli.json)
    assert r.tensors and isinstance(r.tensors[0]["name"], str)
    assert r.totals["tensors"] == len(r.tensors)


def test_prune(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    py_root, cli_root = copy_tree(published, tmp_path / "py"), copy_tree(published, tmp_path / "cli")
    for root in (py_root, cli_root):  # a full version 5 to keep from
        assert tools.run("diff", "-q", "--full", series[4], root / "weight_v000005").code == 0
    dry = hfdelta.prune(py_root, dry_run=True)
    cli = tools.diff_json("--prune", cli_root, "--dry-run")
    assert cli.code == 0, cli.err
    same(dry, cli.json, cli_root, py_root)
    assert dry.dry_run and len(dry.removed) == 4 and (py_root / "weight_v000001").is_dir()
    r = hfdelta.prune(py_root, keep_from=5)
    cli = tools.diff_json("--prune", cli_root, "--keep-from", 5)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_root, py_root)
    assert not (py_root / "weight_v000001").exists() and r.base_full == "000005"


def test_withdraw(tools: Tools, published: Path, tmp_path: Path) -> None:
    py_root, cli_root = copy_tree(published, tmp_path / "py"), copy_tree(published, tmp_path / "cli")
    r = hfdelta.withdraw(py_root / "weight_v000004")
    cli = tools.diff_json("--withdraw", cli_root / "weight_v000004")
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_root, py_root)
    assert r.version == "000004" and not r.already_withdrawn and r.next_base == "000003"
    assert (py_root / "withdrawn_v000004").is_dir() and not (py_root / "weight_v000004").exists()
    assert hfdelta.withdraw(py_root / "weight_v000004").already_withdrawn
    with pytest.raises(hfdelta.BadInput):
        hfdelta.withdraw(py_root / "weight_v000009")


# ---- delta-apply ----

def test_init_apply_status_verify_recover(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    py_local, cli_local = tmp_path / "py", tmp_path / "cli"
    r = hfdelta.init(series[0], py_local)
    cli = tools.apply_json("--init", series[0], cli_local)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_local, py_local)
    assert isinstance(r, hfdelta.ChangeResult) and r.to_version == "000000" and r.from_version is None
    assert "exit_code" not in r.to_dict() and "error" not in r.to_dict()

    r = hfdelta.apply(published / "weight_v000001", py_local, threads=1, lock_timeout=5)
    cli = tools.apply_json("--threads", 1, "--lock-timeout", 5, published / "weight_v000001", cli_local)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_local, py_local)
    assert r.applied == ["000001"] and r.tensors_patched > 0

    s = hfdelta.status(py_local)
    cli = tools.apply_json("--status", cli_local)
    assert cli.code == 0, cli.err
    same(s, cli.json, cli_local, py_local)
    assert (s.state, s.version, s.exit_code, s.ok) == ("clean", "000001", 0, True)

    v = hfdelta.verify(py_local)
    cli = tools.apply_json("--verify", cli_local)
    assert cli.code == 0, cli.err
    same(v, cli.json, cli_local, py_local)
    assert v.state == "clean" and v.problems == [] and v.bytes > 0

    r = hfdelta.recover(py_local)
    cli = tools.apply_json("--recover", cli_local)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_local, py_local)
    assert r.rolled_back is None


def test_pull(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    py_local, cli_local = tmp_path / "py", tmp_path / "cli"
    hfdelta.init(series[0], py_local)
    assert tools.run("apply", "-q", "--init", series[0], cli_local).code == 0
    r = hfdelta.pull(published, py_local, target=2)
    cli = tools.apply_json("--root", published, "--target", 2, cli_local)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_local, py_local)
    assert isinstance(r, hfdelta.PullResult) and isinstance(r, hfdelta.ChangeResult)
    assert r.applied == ["000001", "000002"] and r.behind == 2 and r.newest_version == "000004"
    assert r.behind_complete == 2  # versions 3 and 4 are complete
    seen: list[int] = []
    r = hfdelta.pull(published, py_local, require_marker=False, then=seen.append, pre_read=lambda: None)
    cli = tools.apply_json("--root", published, "--then", "true", "--pre-read", "true", cli_local)
    assert cli.code == 0, cli.err
    same(r, cli.json, cli_local, py_local)
    assert seen == [4] and r.to_version == "000004" and r.behind == 0
    # Every file as in the last save.
    for f in series[4].iterdir():
        assert (py_local / f.name).read_bytes() == f.read_bytes()


def test_pull_phases(series: list[Path], published: Path, tmp_path: Path) -> None:
    """The time before the callback (the engine still serving) apart from the callback's (its reload)."""
    local = tmp_path / "local"
    hfdelta.init(series[0], local)
    r = hfdelta.pull(published, local, target=2, then=lambda v: time.sleep(0.3))
    p = r.phases
    assert p["then"] is not None and p["then"] >= 0.3
    for k in ("lock", "read", "patch", "sync"):
        assert p[k] >= 0
    assert abs(p["before_then"] - (p["lock"] + p["read"] + p["patch"] + p["sync"])) < 1e-6
    assert [(v["version"], v["full"]) for v in p["versions"]] == [("000001", False), ("000002", False)]
    assert all(v[k] >= 0 for v in p["versions"] for k in ("read", "patch", "sync"))
    assert hfdelta.pull(published, local, target=2).phases["then"] is None  # no callback, nothing to do


def test_status_and_verify_states(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    s = hfdelta.status(empty)  # no exception: the state is the result
    cli = tools.apply_json("--status", empty)
    assert cli.code == 11
    same(s, cli.json)
    assert (s.state, s.exit_code, s.ok) == ("uninitialised", 11, False)
    v = hfdelta.verify(empty)
    cli = tools.apply_json("--verify", empty)
    assert cli.code == 11
    same(v, cli.json)
    assert (v.state, v.exit_code) == ("uninitialised", 11)

    # Corrupt: a byte of a weight file changed behind the tool's back.
    local = tmp_path / "local"
    hfdelta.init(series[0], local)
    weights = next(local.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    v = hfdelta.verify(local)
    cli = tools.apply_json("--verify", local)
    assert cli.code == 12
    same(v, cli.json)
    assert (v.state, v.exit_code, v.ok) == ("corrupt", 12, False) and v.problems


def test_interrupted(tools: Tools, interrupted_local: Path) -> None:
    s = hfdelta.status(interrupted_local)
    cli = tools.apply_json("--status", interrupted_local)
    assert cli.code == 10
    same(s, cli.json)
    assert (s.state, s.pending, s.exit_code) == ("interrupted", "000001", 10)
    v = hfdelta.verify(interrupted_local)
    assert (v.state, v.exit_code) == ("interrupted", 10)
    r = hfdelta.recover(interrupted_local)
    assert r.rolled_back == "000001" and r.to_version == "000000"
    assert hfdelta.status(interrupted_local).state == "clean"


def test_result_types() -> None:
    # Every result dataclass is frozen and has to_dict.
    for cls in (results.DiffResult, results.FullResult, results.SquashResult, results.Inspection,
                results.PruneResult, results.WithdrawResult, results.ChangeResult, results.PullResult, results.StatusResult,
                results.VerifyResult):
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert callable(getattr(cls, "to_dict"))


def test_frozen(series: list[Path], tmp_path: Path) -> None:
    r = hfdelta.init(series[0], tmp_path / "local")
    with pytest.raises(AttributeError):
        r.noop = False  # type: ignore[misc]
