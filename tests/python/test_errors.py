"""The exceptions: one class per exit code, raised where the CLI exits with that code,
with the kind and path its --json error object has."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

import hfdelta
from hfdelta import errors

from conftest import Tools, copy_tree


def check_error(exc: hfdelta.HfdeltaError, cli_json: dict[str, Any], code: int) -> None:
    """The exception says what the CLI's error object says."""
    assert exc.exit_code == code == cli_json["exit_code"]
    assert exc.kind == cli_json["error"]["kind"] == hfdelta._core.error_kind(code)
    assert cli_json["ok"] is False
    assert exc.to_dict()["error"]["kind"] == exc.kind


def test_classes() -> None:
    """Every exit code of the core's table (include/hfdelta/error.hpp) has its class, named as the table says,
    with the table's kind; and hfdelta.errors has no class for a code the table lacks."""
    table = hfdelta._core.exit_codes()
    assert [row[0] for row in table] == list(range(len(table)))
    for code, kind, name, meaning in table[1:]:
        cls = getattr(errors, name)
        assert name in errors.__all__ and getattr(hfdelta, name) is cls, name
        assert errors.error_class(code) is cls and issubclass(cls, hfdelta.HfdeltaError)
        assert cls.exit_code == code and cls.kind == kind == hfdelta._core.error_kind(code)
        assert cls.__doc__ is not None and cls.__doc__.startswith(f"Exit {code}: "), (name, meaning)
    codes = {c.exit_code for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, hfdelta.HfdeltaError) and c not in (hfdelta.HfdeltaError,
                                                                                          errors.Stopped)}
    assert codes == {row[0] for row in table[1:]}
    assert errors.error_class(130) is errors.Stopped and hfdelta._core.error_kind(130) == "stopped"


def test_usage(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    with pytest.raises(hfdelta.UsageError) as e:
        hfdelta.diff(series[0], series[1], tmp_path / "x", encoding="zip", delta_version=1)
    assert e.value.exit_code == 2 and e.value.path is None and "encoding" in e.value.message
    assert isinstance(e.value, ValueError)
    with pytest.raises(hfdelta.UsageError):
        hfdelta.diff(series[0], series[1], tmp_path / "x", level=40, delta_version=1)
    with pytest.raises(hfdelta.UsageError):
        hfdelta.apply(series[0], tmp_path, lock_timeout=-1)
    with pytest.raises(hfdelta.UsageError):
        hfdelta.inspect(42)  # type: ignore[arg-type]
    # A misspelled version directory name: exit 2 in the CLI too.
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(hfdelta.UsageError) as e:
        hfdelta.diff(series[0], series[1], root / "weight_v1")
    cli = tools.diff_json(series[0], series[1], root / "weight_v1")
    assert cli.code == 2
    check_error(e.value, cli.json, 2)
    assert e.value.message == errors.python_advice(cli.json["error"]["message"])
    assert e.value.path == cli.json["error"]["path"]


def test_root_inside_a_checkpoint_or_not_created(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    new = copy_tree(series[1], tmp_path / "new")
    for make in (False, True):
        if make:
            (new / "weights").mkdir()
        with pytest.raises(hfdelta.BadInput, match="inside NEW") as e:
            hfdelta.diff(series[0], new, new / "weights")
        cli = tools.diff_json(series[0], new, new / "weights")
        assert cli.code == 3 and e.value.message == errors.python_advice(cli.json["error"]["message"])
        with pytest.raises(hfdelta.BadInput, match="inside NEW"):
            hfdelta.publish_full(new, new / "weights", base=series[0])
        with pytest.raises(hfdelta.BadInput, match="inside NEW"):
            hfdelta.publish_full(new, new / "weights")
    assert sorted(os.listdir(new / "weights")) == []
    typo = tmp_path / "weigths"
    with pytest.raises(hfdelta.UsageError, match="create the publication root first") as u:
        hfdelta.diff(series[0], series[1], typo)
    cli = tools.diff_json(series[0], series[1], typo)
    # The CLI's "give --delta-version" is "pass delta_version" in Python: the rest is the same.
    assert cli.code == 2 and u.value.message == errors.python_advice(cli.json["error"]["message"])
    assert "pass delta_version" in u.value.message
    with pytest.raises(hfdelta.UsageError, match="create the publication root first"):
        hfdelta.publish_full(series[1], typo)
    assert not typo.exists()


def test_advice_names_python_calls(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    """Where the CLI's message advises a command, the exception's names the function."""
    local = tmp_path / "local"
    hfdelta.init(series[0], local)
    with pytest.raises(hfdelta.BadInput) as e:
        hfdelta.pull(local, published)  # swapped: the root given as LOCAL
    cli = tools.apply_json("--root", local, published)
    assert cli.code == 3 and "(delta-apply --root ROOT LOCAL)" in cli.json["error"]["message"]
    assert e.value.message == cli.json["error"]["message"].replace("delta-apply --root ROOT LOCAL",
                                                                   "hfdelta.pull(root, local)")
    missing = tmp_path / "missing"
    with pytest.raises(hfdelta.OutOfOrder) as m:
        hfdelta.apply(published / "weight_v000001", missing)
    assert f"set it up first with hfdelta.init(src, {str(missing)!r})" in m.value.message
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a LOCAL")
    with pytest.raises(hfdelta.Exists) as x:
        hfdelta.init(series[0], other)
    assert "pass force=True to replace it" in x.value.message
    for exc in (e.value, m.value, x.value):
        assert "delta-apply" not in exc.message and "--" not in exc.message, exc.message


def test_python_advice() -> None:
    """Each command the library's messages advise, as its call; options outside commands, as arguments."""
    cases = {
        "(delta-apply DELTA LOCAL)": "(hfdelta.apply(delta, local))",
        "publish one: delta-diff --full NEW ROOT)": "publish one: hfdelta.publish_full(new, root))",
        "(delta-apply --init CHECKPOINT MIRROR --init-version 4)": "(hfdelta.init(checkpoint, mirror, version=4))",
        "(delta-apply --init CHECKPOINT MIRROR, then delta-apply --root ROOT MIRROR)":
            "(hfdelta.init(checkpoint, mirror), then hfdelta.pull(root, mirror))",
        "first (delta-diff --full)": "first (hfdelta.publish_full)",
        "publish into it with delta-diff BASE NEW /s/weights (nothing was written)":
            "publish into it with hfdelta.diff(base, new, '/s/weights') (nothing was written)",
        "delta-apply --verify checks it, delta-apply --init re-creates it":
            "hfdelta.verify checks it, hfdelta.init re-creates it",
        "the next delta-apply on it, or delta-apply --recover, finishes the rollback":
            "the next apply or pull on it, or hfdelta.recover(local), finishes the rollback",
        "(or use --init with --init-version)": "(or use hfdelta.init with version)",
        # a publisher's setting, not hfdelta's, and paths that hold the names: kept
        "(--update-weight-delta-checksum xxh3-128)": "(--update-weight-delta-checksum xxh3-128)",
        "/data/delta-apply/--init: not a directory": "/data/delta-apply/--init: not a directory",
    }
    for cli, py in cases.items():
        assert errors.python_advice(cli) == py


def test_bad_input(tools: Tools, series: list[Path]) -> None:
    with pytest.raises(hfdelta.BadInput) as e:
        hfdelta.inspect(series[0])  # a checkpoint, not a delta
    cli = tools.diff_json("--inspect", series[0])
    assert cli.code == 3
    check_error(e.value, cli.json, 3)
    assert e.value.message == errors.python_advice(cli.json["error"]["message"])
    assert e.value.path == cli.json["error"]["path"] and e.value.path is not None


def test_out_of_order(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    hfdelta.init(series[0], local)
    with pytest.raises(hfdelta.OutOfOrder) as e:
        hfdelta.apply(published / "weight_v000002", local)  # LOCAL is at 0, not 1
    cli = tools.apply_json(published / "weight_v000002", local)
    assert cli.code == 4
    check_error(e.value, cli.json, 4)
    assert e.value.message == errors.python_advice(cli.json["error"]["message"])


def test_exists(tools: Tools, series: list[Path], published: Path) -> None:
    with pytest.raises(hfdelta.Exists) as e:
        hfdelta.diff(series[0], series[1], published / "weight_v000001")
    cli = tools.diff_json(series[0], series[1], published / "weight_v000001")
    assert cli.code == 7
    check_error(e.value, cli.json, 7)
    assert e.value.path == cli.json["error"]["path"] == str(published / "weight_v000001")


def test_lock_timeout(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    hfdelta.init(series[0], local)
    with open(local / ".weight_sync" / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(hfdelta.LockTimeout) as e:
            hfdelta.apply(published / "weight_v000001", local, lock_timeout=0.2)
        cli = tools.apply_json("--lock-timeout", 0.2, published / "weight_v000001", local)
        assert cli.code == 8
        check_error(e.value, cli.json, 8)
        with pytest.raises(hfdelta.LockTimeout):
            hfdelta.status(local, lock_timeout=0)
    assert hfdelta.status(local).version == "000000"


def test_then_failed(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    py_local, cli_local = tmp_path / "py", tmp_path / "cli"
    hfdelta.init(series[0], py_local)
    assert tools.run("apply", "-q", "--init", series[0], cli_local).code == 0
    seen: list[tuple[int, str]] = []

    def reload(version: int) -> None:
        # LOCAL is still locked: another taker times out.
        try:
            hfdelta.status(py_local, lock_timeout=0)
            seen.append((version, "unlocked"))
        except hfdelta.LockTimeout:
            seen.append((version, "locked"))
        raise RuntimeError("engine reload failed")

    with pytest.raises(hfdelta.ThenFailed) as e:
        hfdelta.apply(published / "weight_v000001", py_local, then=reload)
    assert seen == [(1, "locked")]
    assert isinstance(e.value.__cause__, RuntimeError)
    result = e.value.result
    assert result is not None and result.to_version == "000001"  # applied all the same
    assert hfdelta.status(py_local).version == "000001"
    cli = tools.apply_json("--then", "false", published / "weight_v000001", cli_local)
    assert cli.code == 9
    check_error(e.value, cli.json, 9)
    d = result.to_dict()
    assert set(d) == set(cli.json)
    assert (d["ok"], d["exit_code"], d["error"]["kind"]) == (False, 9, "then_failed")
    assert d["error"]["path"] == os.path.abspath(py_local) == e.value.path
    assert "RuntimeError" in e.value.message


def test_pre_read_failed(tools: Tools, series: list[Path], published: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    hfdelta.init(series[0], local)

    def refresh() -> None:
        raise OSError("the object store is unreachable")

    with pytest.raises(hfdelta.PreReadFailed) as e:
        hfdelta.pull(published, local, pre_read=refresh)
    assert isinstance(e.value.__cause__, OSError) and e.value.exit_code == 14
    assert hfdelta.status(local).version == "000000"  # untouched
    cli = tools.apply_json("--root", published, "--pre-read", "false", local)
    assert cli.code == 14
    check_error(e.value, cli.json, 14)


def test_status_and_verify_raise_for_bad_paths(tools: Tools, tmp_path: Path) -> None:
    # A LOCAL that does not exist is an error, not a state: the CLI prints its
    # error object (exit 11) instead of a status object.
    with pytest.raises(hfdelta.Uninitialised) as e:
        hfdelta.status(tmp_path / "missing")
    cli = tools.apply_json("--status", tmp_path / "missing")
    assert cli.code == 11 and "error" in cli.json
    check_error(e.value, cli.json, 11)
    assert e.value.path == cli.json["error"]["path"] == str(tmp_path / "missing")
    with pytest.raises(hfdelta.Uninitialised):
        hfdelta.verify(tmp_path / "missing")
