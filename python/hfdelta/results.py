"""The results of hfdelta's functions: the CLIs' ``--json`` objects as frozen dataclasses.

Each result's fields are exactly the keys of the JSON object the CLI prints for
the same form (``schema`` and ``ok`` included; versions are the same
zero-padded strings, ``"000007"``), built from the same library code;
``to_dict()`` gives that object back. Nested objects are plain dicts, typed
with the TypedDicts below. See man delta-diff and man delta-apply (JSON
OUTPUT) for what each field means.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, NotRequired, Optional, TypedDict, TypeVar


__all__ = [
    "DiffResult",
    "FullResult",
    "SquashResult",
    "Inspection",
    "PruneResult",
    "WithdrawResult",
    "ChangeResult",
    "PullResult",
    "StatusResult",
    "VerifyResult",
    "DiffEntries",
    "DiffStructure",
    "SquashStructure",
    "SidecarSummary",
    "InspectTensor",
    "InspectFile",
    "InspectWeightFile",
    "InspectEntryCounts",
    "InspectTotals",
    "PrunedVersion",
    "ErrorInfo",
    "Phases",
    "VersionPhases",
]

_R = TypeVar("_R", bound="_Result")


@dataclass(frozen=True, kw_only=True)
class _Result:
    schema: int
    ok: bool

    # Keys the CLI's object has only sometimes: a field that is None is left
    # out of to_dict() (and may be missing from the object).
    _optional_keys: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """The CLI's ``--json`` object for this result."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self._optional_keys and value is None:
                continue
            out[f.name] = copy.deepcopy(value)
        return out

    @classmethod
    def _from_json(cls: type[_R], text: str) -> _R:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        missing = names - set(data) - cls._optional_keys
        if unknown or missing:  # the library and this package disagree: a build mix-up
            raise RuntimeError(f"hfdelta: {cls.__name__}: the library's object has keys {sorted(unknown)} "
                               f"this package does not know, and lacks {sorted(missing)}")
        return cls(**data)


# ---- delta-diff ----

class DiffEntries(TypedDict):
    """Entries of each encoding a delta may be written in (``whole_delta`` in hfdelta.ENCODINGS)."""

    sparse: int
    xor: int
    overwrite: int
    context: int


class DiffStructure(TypedDict):
    weight_files_built: int
    headers_rewritten: int
    weight_files_removed: int
    tensors_new: int


@dataclass(frozen=True, kw_only=True)
class DiffResult(_Result):
    """``delta-diff --json BASE NEW OUT``: the delta version written."""
    out: str
    version: str
    base_version: str
    encoding: str
    tensors: int
    tensors_changed: int
    elements: int
    elements_changed: int
    density: float
    tensor_bytes: int
    bytes_changed: int
    full_bytes: int
    delta_bytes: int
    files_changed: int
    files_removed: int
    entries: DiffEntries
    structure: DiffStructure
    seconds: float


class SidecarSummary(TypedDict):
    out: str
    base_version: str
    delta_bytes: int
    tensors_changed: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class FullResult(_Result):
    """``delta-diff --full --json [BASE] NEW OUT``: the full version published (and the delta beside it)."""
    out: str
    version: str
    full: bool
    files: int
    bytes: int
    seconds: float
    sidecar: Optional[SidecarSummary]


class SquashStructure(TypedDict):
    weight_files_built: int
    headers_rewritten: int
    weight_files_removed: int


@dataclass(frozen=True, kw_only=True)
class SquashResult(_Result):
    """``delta-diff --squash --json FIRST LAST OUT``: the squashed delta written."""
    out: str
    version: str
    base_version: str
    deltas: int
    entries: int
    entries_composed: int
    entries_dropped: int
    entries_stacked: int
    structure: SquashStructure
    files_changed: int
    files_removed: int
    input_bytes: int
    delta_bytes: int
    seconds: float


class InspectTensor(TypedDict):
    name: str
    file: str
    encoding: str
    entry_bytes: int
    tensor_bytes: Optional[int]
    element_size: Optional[int]
    changed_elements: Optional[int]
    changed_bytes: Optional[int]
    checksum: str
    base_checksum: Optional[str]
    stack_parts: Optional[int]
    needs_base: bool  # context entries: positions are checked against the base only when applied


class InspectFile(TypedDict):
    path: str
    op: str
    size: Optional[int]
    checksum: Optional[str]


class InspectWeightFile(TypedDict):
    file: str
    op: str  # build, header or remove
    header_bytes: NotRequired[int]  # build and header
    size: NotRequired[int]  # build only, as the rest
    tensors: NotRequired[int]
    copied: NotRequired[int]
    renamed: NotRequired[int]
    new: NotRequired[int]


class InspectEntryCounts(TypedDict):
    """Entries of each encoding (every name of hfdelta.ENCODINGS)."""

    sparse: int
    xor: int
    overwrite: int
    stack: int
    context: int
    parts: int


class InspectTotals(TypedDict):
    tensors: int
    entries: InspectEntryCounts
    entry_bytes: int
    tensor_bytes: Optional[int]
    changed_elements: int
    changed_bytes: int
    files_put: int
    files_removed: int
    weight_files_built: int
    headers_rewritten: int
    weight_files_removed: int
    file_bytes: int
    delta_bytes: int


@dataclass(frozen=True, kw_only=True)
class Inspection(_Result):
    """``delta-diff --inspect --json DELTA``: what a delta version changes."""
    delta: str
    version: str
    base_version: str
    format: Optional[int]
    encoding: str
    checksum_format: str
    index_checksum: Optional[str]
    tensors: list[InspectTensor]
    files: list[InspectFile]
    weight_files: list[InspectWeightFile]
    totals: InspectTotals


class PrunedVersion(TypedDict):
    version: str
    full: bool
    sidecar: bool
    withdrawn: bool
    path: str


@dataclass(frozen=True, kw_only=True)
class PruneResult(_Result):
    """``delta-diff --prune --json ROOT``: what was (with dry_run: would be) removed and kept."""
    root: str
    dry_run: bool
    keep_from: Optional[str]
    base_full: Optional[str]
    removed: list[PrunedVersion]
    kept: list[PrunedVersion]
    leftovers: list[str]
    bytes_removed: int


@dataclass(frozen=True, kw_only=True)
class WithdrawResult(_Result):
    """``delta-diff --withdraw --json ROOT/weight_vNNNNNN``: the version taken back out of its root."""
    root: str
    version: str
    withdrawn: str
    sidecar: Optional[str]
    already_withdrawn: bool
    stranded: list[str]
    in_flight: list[str]
    next_base: Optional[str]


# ---- delta-apply ----

class ErrorInfo(TypedDict):
    kind: str
    message: str
    path: Optional[str]


class VersionPhases(TypedDict):
    version: str
    full: bool  # a full version copied, not a delta applied
    read: float
    patch: float
    sync: float


class Phases(TypedDict):
    """Seconds by phase. lock, read, patch and sync come before ``then`` (an engine still serves the old
    weights; ``before_then`` is their sum); ``then`` is the callback (the engine's reload), None when
    none ran. ``versions``: each version's own share (reading ROOT counts in the totals only)."""
    lock: float
    read: float
    patch: float
    sync: float
    then: Optional[float]
    before_then: float
    versions: list[VersionPhases]


@dataclass(frozen=True, kw_only=True)
class ChangeResult(_Result):
    """``delta-apply --json`` (DELTA LOCAL, --init, --recover): what changed in LOCAL.

    ``exit_code`` and ``error`` are there (not None) only when the ``then``
    callback failed after the operation succeeded (``ok`` false, exit 9: see
    :class:`~hfdelta.errors.ThenFailed`); to_dict() leaves them out otherwise,
    as the CLI does.
    """
    _optional_keys: ClassVar[frozenset[str]] = frozenset({"exit_code", "error"})

    local: str
    from_version: Optional[str]
    to_version: Optional[str]
    applied: list[str]
    noop: bool
    record_rewritten: bool
    rolled_back: Optional[str]
    tensors_patched: int
    delta_bytes: int
    files_written: int
    files_removed: int
    seconds: float
    phases: Phases
    exit_code: Optional[int] = None
    error: Optional[ErrorInfo] = None


@dataclass(frozen=True, kw_only=True)
class PullResult(ChangeResult):
    """``delta-apply --root --json ROOT LOCAL``: a ChangeResult with what ROOT publishes."""
    versions_published: int
    newest_version: Optional[str]
    behind: int
    behind_complete: int
    was_behind: Optional[int]
    not_published_yet: Optional[str]
    waiting_for: Optional[str]
    full_copied: Optional[str]
    sidecars_applied: int
    root_bytes: int
    fallback: Optional[str]
    newer_complete: list[str]


@dataclass(frozen=True, kw_only=True)
class StatusResult(_Result):
    """``delta-apply --status --json LOCAL``: state clean (exit_code 0), interrupted (10) or uninitialised (11)."""
    local: str
    state: str
    version: Optional[str]
    pending: Optional[str]
    exit_code: int


@dataclass(frozen=True, kw_only=True)
class VerifyResult(_Result):
    """``delta-apply --verify --json LOCAL``: state clean (0), interrupted (10), uninitialised (11) or corrupt (12)."""
    local: str
    state: str
    version: Optional[str]
    pending: Optional[str]
    weight_files: int
    tensors: int
    files: int
    bytes: int
    problems: list[str]
    exit_code: int
