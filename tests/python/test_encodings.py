"""hfdelta.ENCODINGS is the core's table of encodings (include/hfdelta/encodings.hpp), and the
names the results use are its names."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

import hfdelta
from hfdelta import _core, results

from conftest import Tools

DOCS = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def test_encodings_come_from_the_core() -> None:
    assert hfdelta.ENCODINGS == tuple(hfdelta.EncodingInfo(*row) for row in _core.encodings())
    names = [e.name for e in hfdelta.ENCODINGS]
    assert len(set(names)) == len(names)
    assert {"xor", "overwrite", "sparse", "context", "stack", "parts"} <= set(names)


def test_encodings_are_the_documented_table() -> None:
    text = DOCS.read_text()
    head = "| name | magic | code | revision | chunked | needs base | whole delta | in parts |"
    rows = text[text.index(head):].splitlines()[2:]
    documented = [re.sub(r"[`\s]", "", r.split("|")[1]) for r in rows[:len(hfdelta.ENCODINGS) + 1]
                  if r.startswith("|")]
    assert documented == [e.name for e in hfdelta.ENCODINGS]


def test_result_types_name_every_encoding() -> None:
    every = {e.name for e in hfdelta.ENCODINGS}
    whole = {e.name for e in hfdelta.ENCODINGS if e.whole_delta}
    assert set(typing.get_type_hints(results.InspectEntryCounts)) == every
    assert set(typing.get_type_hints(results.DiffEntries)) == whole


def test_inspect_counts_every_encoding(published: Path) -> None:
    r = hfdelta.inspect(published / "weight_v000002")
    assert set(r.totals["entries"]) == {e.name for e in hfdelta.ENCODINGS}


def test_diff_takes_the_whole_delta_encodings(tools: Tools, series: list[Path], tmp_path: Path) -> None:
    for e in hfdelta.ENCODINGS:
        out = tmp_path / e.name
        if e.whole_delta:
            r = hfdelta.diff(series[0], series[1], out, encoding=e.name, delta_version=1)
            assert set(r.entries) == {x.name for x in hfdelta.ENCODINGS if x.whole_delta}
        else:
            with pytest.raises(hfdelta.UsageError):
                hfdelta.diff(series[0], series[1], out, encoding=e.name, delta_version=1)
