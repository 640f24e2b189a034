"""One function per form of delta-diff and delta-apply (see hfdelta/__init__.py)."""

from __future__ import annotations

import os
import warnings
from typing import Callable, NamedTuple, Optional, Union

from . import _core
from .errors import PreReadFailed, ThenFailed, UsageError
from .results import (
    ChangeResult,
    DiffResult,
    FullResult,
    Inspection,
    PruneResult,
    PullResult,
    SquashResult,
    StatusResult,
    VerifyResult,
    WithdrawResult,
)

__all__ = [
    "EncodingInfo",
    "ENCODINGS",
    "PathLike",
    "ProgressCallback",
    "DiffWarning",
    "diff",
    "publish_full",
    "squash",
    "inspect",
    "prune",
    "withdraw",
    "init",
    "apply",
    "pull",
    "status",
    "verify",
    "recover",
]


class EncodingInfo(NamedTuple):
    """One entry encoding of the format (docs/format.md, "Encodings"), as the core's table has it."""

    name: str  # in the index, ``encoding=`` and the results
    magic: str  # an entry's first 4 bytes; "": the entry is one zstd frame
    code: Optional[int]  # names it in a stacked entry's layers and a parts entry's parts
    revision: int  # the lowest format revision that has it
    chunked: bool  # chunks of 2**20 elements that decode independently
    needs_base: bool  # decoding reads the base bytes
    whole_delta: bool  # may be a whole delta's encoding (``encoding=`` of diff and Publisher)
    in_parts: bool  # may be a part of a parts entry (``encoding=`` of ShardedPublisher)


# Every encoding, from the core's table: no second list of names here.
ENCODINGS: tuple[EncodingInfo, ...] = tuple(EncodingInfo(*row) for row in _core.encodings())


PathLike = Union[str, os.PathLike[str]]
"""A path: str or os.PathLike (pathlib.Path)."""

ProgressCallback = Callable[[str, int, int], object]
"""``progress(phase, done, total)``: phase is "diff", "apply", "copy", "hash", "squash", ...; done and total
count bytes (entries for some phases)."""


class DiffWarning(UserWarning):
    """BASE and NEW do not look like successive saves of one model (the delta is valid, but about as large as
    NEW): delta-diff's "warning:" lines."""


def _path(p: PathLike, name: str) -> str:
    try:
        value = os.fspath(p)
    except TypeError:
        raise UsageError(f"{name} must be a path (str or os.PathLike), not {type(p).__name__}") from None
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not value:
        raise UsageError(f"{name} is an empty path, which names nothing")
    return value


def _count(value: Optional[int], name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{name} must be an integer >= 0, not {value!r}")
    return value


def _seconds(value: Optional[float], name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise UsageError(f"{name} must be a number of seconds >= 0 (None: wait), not {value!r}")
    return float(value)


def _callable(value: Optional[Callable[..., object]], name: str) -> None:
    if value is not None and not callable(value):
        raise UsageError(f"{name} must be a callable or None, not {type(value).__name__}")


def _warn(warnings_list: list[str], where: str) -> None:
    for w in warnings_list:
        warnings.warn(f"{where}: {w}", DiffWarning, stacklevel=3)


# ---- delta-diff ----

def diff(base: PathLike, new: PathLike, out: PathLike, *, encoding: str = "context", level: Optional[int] = None,
         delta_version: Optional[int] = None, base_version: Optional[int] = None, threads: int = 0,
         sync: bool = True, progress: Optional[ProgressCallback] = None) -> DiffResult:
    """``delta-diff BASE NEW OUT``: write the delta version that turns checkpoint BASE into NEW.

    OUT is ROOT/weight_vNNNNNN, or a publication root ROOT itself (its newest version + 1 is written;
    ``result.out`` names it), or with ``delta_version`` a delta outside any root. ``encoding``: context
    (the default), sparse, auto, xor or overwrite (xor and overwrite: the slime layout, which slime's,
    miles' and SGLang's receivers read). A DiffWarning is issued for checkpoints that do not look like successive saves.
    """
    _callable(progress, "progress")
    text, notes = _core.diff(_path(base, "base"), _path(new, "new"), _path(out, "out"), encoding, level,
                             _count(delta_version, "delta_version"), _count(base_version, "base_version"),
                             _count(threads, "threads") or 0, bool(sync), progress)
    result = DiffResult._from_json(text)
    _warn(notes, result.out)
    return result


def publish_full(new: PathLike, root: PathLike, *, base: Optional[PathLike] = None, encoding: str = "context",
                 level: Optional[int] = None, delta_version: Optional[int] = None, base_version: Optional[int] = None,
                 threads: int = 0, sync: bool = True, progress: Optional[ProgressCallback] = None) -> FullResult:
    """``delta-diff --full [BASE] NEW ROOT``: publish checkpoint NEW as a full version of ROOT (or as the
    version directory ROOT/weight_vNNNNNN given); with ``base``, first the delta BASE -> NEW beside it
    (ROOT/delta_vNNNNNN), so that a host one version behind fetches only that."""
    _callable(progress, "progress")
    text, notes = _core.publish_full(_path(new, "new"), _path(root, "root"),
                                     None if base is None else _path(base, "base"), encoding, level,
                                     _count(delta_version, "delta_version"), _count(base_version, "base_version"),
                                     _count(threads, "threads") or 0, bool(sync), progress)
    result = FullResult._from_json(text)
    if result.sidecar is not None:
        _warn(notes, result.sidecar["out"])
    return result


def squash(first: PathLike, last: PathLike, out: PathLike, *, base: Optional[PathLike] = None,
           level: Optional[int] = None, threads: int = 0, sync: bool = True,
           progress: Optional[ProgressCallback] = None) -> SquashResult:
    """``delta-diff --squash FIRST LAST OUT``: one delta equal to the delta versions FIRST..LAST (every
    version between them beside them), composed from the deltas alone. With ``base`` (``--squash-base``:
    the checkpoint of the chain's first base), context entries are composed against its bytes into one
    context entry per tensor instead of staying stacked layers; a checkpoint that is not that base raises
    VerifyFailed."""
    _callable(progress, "progress")
    return SquashResult._from_json(_core.squash(_path(first, "first"), _path(last, "last"), _path(out, "out"),
                                                None if base is None else _path(base, "base"), level,
                                                _count(threads, "threads") or 0, bool(sync), progress))


def inspect(delta: PathLike) -> Inspection:
    """``delta-diff --inspect DELTA``: describe and check a delta version directory (a damaged one raises
    BadInput)."""
    return Inspection._from_json(_core.inspect(_path(delta, "delta")))


def prune(root: PathLike, *, keep_from: Optional[int] = None, dry_run: bool = False, sync: bool = True) -> PruneResult:
    """``delta-diff --prune ROOT``: remove the versions no pull to ``keep_from`` or later (default: from the
    newest full version) can need; with ``dry_run``, only say which."""
    return PruneResult._from_json(_core.prune(_path(root, "root"), _count(keep_from, "keep_from"), bool(dry_run),
                                              bool(sync)))


def withdraw(version_dir: PathLike, *, sync: bool = True) -> WithdrawResult:
    """``delta-diff --withdraw ROOT/weight_vNNNNNN``: take a bad version back out of its root (renamed to
    withdrawn_vNNNNNN: hosts that never applied it skip it, its number is never published again, hosts that
    applied it are refused by their next pull until a newer full version exists). Idempotent."""
    return WithdrawResult._from_json(_core.withdraw(_path(version_dir, "version_dir"), bool(sync)))


# ---- delta-apply ----

ThenCallback = Callable[[int], object]


class _Then:
    """The ``then`` callback as the library calls it, keeping the exception it raised."""

    def __init__(self, then: ThenCallback) -> None:
        self.then = then
        self.raised: Optional[BaseException] = None

    def __call__(self, version: int) -> None:
        try:
            self.then(version)
        except BaseException as e:
            self.raised = e
            raise


def _then_hook(then: Optional[ThenCallback]) -> Optional[_Then]:
    _callable(then, "then")
    return None if then is None else _Then(then)


def _changed(result: ChangeResult, hook: Optional[_Then]) -> None:
    """Raises ThenFailed (exit 9) when the `then` callback failed after the operation."""
    if result.exit_code is None or result.error is None:
        return
    err = ThenFailed(result.error["message"], exit_code=result.exit_code, kind=result.error["kind"],
                     path=result.error["path"])
    err.result = result
    raise err from (hook.raised if hook is not None else None)


def init(src: PathLike, local: PathLike, *, version: int = 0, force: bool = False,
         lock_timeout: Optional[float] = None, threads: int = 0, sync: bool = True,
         then: Optional[ThenCallback] = None, progress: Optional[ProgressCallback] = None) -> ChangeResult:
    """``delta-apply --init SRC LOCAL``: make LOCAL an exact copy of checkpoint SRC, recorded as ``version``.
    ``then(version)`` runs while LOCAL is still locked (it raising is ThenFailed, with the result)."""
    _callable(progress, "progress")
    hook = _then_hook(then)
    result = ChangeResult._from_json(_core.init(_path(src, "src"), _path(local, "local"), _count(version, "version") or 0,
                                                bool(force), _seconds(lock_timeout, "lock_timeout"),
                                                _count(threads, "threads") or 0, bool(sync), hook, progress))
    _changed(result, hook)
    return result


def apply(delta: PathLike, local: PathLike, *, lock_timeout: Optional[float] = None, threads: int = 0,
          sync: bool = True, then: Optional[ThenCallback] = None,
          progress: Optional[ProgressCallback] = None) -> ChangeResult:
    """``delta-apply DELTA LOCAL``: apply one delta version on top of LOCAL's version."""
    _callable(progress, "progress")
    hook = _then_hook(then)
    result = ChangeResult._from_json(_core.apply(_path(delta, "delta"), _path(local, "local"),
                                                 _seconds(lock_timeout, "lock_timeout"),
                                                 _count(threads, "threads") or 0, bool(sync), hook, progress))
    _changed(result, hook)
    return result


def pull(root: PathLike, local: PathLike, *, target: Optional[int] = None, require_marker: bool = False,
         pre_read: Optional[Callable[[], object]] = None, then: Optional[ThenCallback] = None,
         lock_timeout: Optional[float] = None, threads: int = 0, sync: bool = True,
         progress: Optional[ProgressCallback] = None) -> PullResult:
    """``delta-apply --root ROOT LOCAL``: bring LOCAL to version ``target`` (default: ROOT's newest).

    ``pre_read()`` runs before ROOT is read (e.g. to refresh a view of an object store); it raising is
    PreReadFailed (exit 14), LOCAL untouched.
    """
    _callable(progress, "progress")
    _callable(pre_read, "pre_read")
    hook = _then_hook(then)
    root_s, local_s = _path(root, "root"), _path(local, "local")
    target = _count(target, "target")
    lock = _seconds(lock_timeout, "lock_timeout")
    nthreads = _count(threads, "threads") or 0
    if pre_read is not None:
        try:
            pre_read()
        except Exception as e:
            message = f"pre_read raised {e!r}"
            raise PreReadFailed(message) from e
    result = PullResult._from_json(_core.pull(root_s, local_s, target, bool(require_marker), lock, nthreads,
                                              bool(sync), hook, progress))
    _changed(result, hook)
    return result


def status(local: PathLike, *, lock_timeout: Optional[float] = None) -> StatusResult:
    """``delta-apply --status LOCAL``: LOCAL's state, read under its lock. An interrupted or uninitialised
    LOCAL is a result (``state``, ``exit_code``, ``ok`` false), not an exception."""
    return StatusResult._from_json(_core.status(_path(local, "local"), _seconds(lock_timeout, "lock_timeout")))


def verify(local: PathLike, *, lock_timeout: Optional[float] = None, threads: int = 0,
           progress: Optional[ProgressCallback] = None) -> VerifyResult:
    """``delta-apply --verify LOCAL``: re-hash LOCAL against the checksums of its version. An interrupted,
    uninitialised or corrupt LOCAL is a result (``state``, ``exit_code``, ``ok`` false, ``problems``)."""
    _callable(progress, "progress")
    return VerifyResult._from_json(_core.verify(_path(local, "local"), _seconds(lock_timeout, "lock_timeout"),
                                                _count(threads, "threads") or 0, progress))


def recover(local: PathLike, *, lock_timeout: Optional[float] = None) -> ChangeResult:
    """``delta-apply --recover LOCAL``: only roll back an interrupted apply, if any."""
    return ChangeResult._from_json(_core.recover(_path(local, "local"), _seconds(lock_timeout, "lock_timeout"), True))
