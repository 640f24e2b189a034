"""Publishing straight from the trainer's memory (hfdelta.Publisher).

A trainer holds the new weights in memory after each optimizer step. Instead of
saving them (2 bytes a parameter) and diffing the save against the previous one
(4 more read), a Publisher diffs each tensor, as it is given, against a *mirror*:
a LOCAL on the trainer's host (``hfdelta.init(CHECKPOINT, MIRROR)``) that holds
the last published version. It then publishes version newest + 1 into the
publication root -- byte for byte the delta ``delta-diff MIRROR NEW ROOT`` writes
for a save NEW of the same tensors -- and advances the mirror by applying that
delta the way delta-apply does (journalled, checked, crash-safe).

Tensors come one at a time, in any order, from numpy arrays (ml_dtypes'
bfloat16 and float8 included), torch CPU tensors, or anything speaking DLPack or
the buffer protocol on the CPU; a tensor is read while it is encoded and never
kept, so memory does not grow with the model.

Where the package is built with CUDA (hfdelta._core.cuda), a tensor on a CUDA
device (torch, or any DLPack capsule whose device is CUDA) has its changes
found on its device, against the mirror's bytes of it kept there (one copy of
the weights on the device: cuda/README.md), and only the changes are copied
to the host; the version is byte for byte the one published from the same
bytes on the host. Such tensors are published as "sparse" or "context" only
(others raise UsageError). Without CUDA in the build they raise UsageError
saying so.

Opening a Publisher reconciles mirror and root: an interrupted mirror advance is
rolled back, and a mirror behind the root (the process died after publishing)
is caught up from it; any other disagreement is refused, saying what to do.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterable, Iterator, Mapping, Optional, Tuple, Union

from . import _core
from ._api import PathLike, ProgressCallback, _count, _path, _seconds
from .errors import UsageError
from .results import ChangeResult, DiffResult

__all__ = ["Publisher", "PublishResult", "Opening", "TensorLike"]

TensorLike = Any
"""A numpy array (ml_dtypes' bfloat16 and float8 included), a torch tensor, or any array that speaks DLPack or
the buffer protocol, on the CPU (or on a CUDA device, where the package is built with CUDA). Row-major and contiguous is read in place; anything else is copied first, one
tensor at a time."""

Tensors = Union[Mapping[str, TensorLike], Iterable[Tuple[str, TensorLike]]]

# numpy dtype names -> safetensors dtypes, for arrays passed as their bytes:
# ml_dtypes' types have no DLPack or buffer-protocol form.
_NUMPY_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
    "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "float32": "F32", "float64": "F64",
    "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


@dataclass(frozen=True)
class Opening:
    """What opening the publisher found: the mirror's version (the newest published), an interrupted mirror
    advance rolled back, versions applied to the mirror from the root to catch it up."""
    version: int
    rolled_back: Optional[int]
    caught_up: list[int]


@dataclass(frozen=True, kw_only=True)
class PublishResult(DiffResult):
    """The version published: delta-diff's ``--json`` fields for it, and how the tensors came. ``mirror`` is the
    mirror's apply (a ChangeResult) when the call waited for it, else None (it runs in the background; see
    Publisher.wait)."""
    tensors_given: int
    tensors_declared_unchanged: int
    mirror: Optional[ChangeResult]

    @classmethod
    def _from_report(cls, text: str) -> "PublishResult":
        data = json.loads(text)
        mirror = data.pop("mirror")
        return cls(**data, mirror=ChangeResult._from_json(json.dumps(mirror)) if mirror is not None else None)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["mirror"] = self.mirror.to_dict() if self.mirror is not None else None
        return out


def _item(name: str, tensor: TensorLike) -> Tuple[str, Any, Optional[str], Optional[list[int]]]:
    """(name, array, dtype, shape) for _core: numpy arrays as their bytes with the dtype named here; anything
    else (torch, DLPack objects) as it is, its dtype and shape read from DLPack."""
    import numpy as np

    if not isinstance(name, str):
        raise UsageError(f"tensor names are str, not {type(name).__name__}")
    if hasattr(tensor, "__dlpack_device__") and tensor.__dlpack_device__()[0] != 1:  # kDLCPU
        device = tuple(tensor.__dlpack_device__())
        if device[0] != 2:  # kDLCUDA
            raise UsageError(f"tensor '{name}': not in host memory nor on a CUDA device (DLPack device {device}); "
                             "copy it to the host first (torch: .cpu())")
        if not _core.cuda:
            raise UsageError(f"tensor '{name}': on a CUDA device (DLPack device {device}), but this build of hfdelta "
                             "has no CUDA (built without -Dcuda): copy it to the host first (torch: .cpu())")
        # Built with CUDA: its changes are found on its device, and only they copied to the host.
    if type(tensor).__name__ == "PyCapsule":  # a DLPack capsule: its device and dtype read from it (_core)
        return name, tensor, None, None
    if hasattr(tensor, "detach") and hasattr(tensor, "__dlpack__"):  # torch: no autograd history to export
        tensor = tensor.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        return name, tensor, None, None
    if not isinstance(tensor, np.ndarray):
        if hasattr(tensor, "__dlpack__"):
            return name, tensor, None, None
        tensor = np.asarray(tensor)  # the buffer protocol
    dtype = _NUMPY_DTYPES.get(tensor.dtype.name)
    if dtype is None:
        raise UsageError(f"tensor '{name}': numpy dtype {tensor.dtype.name} has no safetensors name")
    if not tensor.dtype.isnative:  # safetensors is little-endian, like every host hfdelta runs on
        tensor = tensor.astype(tensor.dtype.newbyteorder("="))
    if not tensor.flags.c_contiguous:
        tensor = np.ascontiguousarray(tensor)
    return name, tensor.reshape(-1).view(np.uint8), dtype, [int(d) for d in tensor.shape]


class Publisher:
    """Publishes versions into ``root`` from tensors in memory, diffed against ``mirror``.

    ``encoding``: "context" (default), "sparse", "auto", "xor" or "overwrite", as delta-diff's --encoding. With
    ``background`` (default) the mirror is advanced in a thread of its own once a version is published, so the
    trainer goes on at once; the next publish (or wait(), or close()) waits for it. Use as a context manager, or
    call close(). One publisher per mirror (a second waits ``lock_timeout`` seconds, then raises LockTimeout;
    None, the default, waits forever; a negative number raises UsageError, as the CLI's --lock-timeout refuses
    it), and one per root: a publisher overtaken by another raises Exists; open it again to catch up.

    ``root`` and ``mirror`` are checked before anything is created in either, as the CLI checks its paths: a LOCAL
    given as the root (the arguments swapped, or a host's LOCAL) and a root and mirror one inside the other raise
    BadInput, a mirror never initialised raises Uninitialised.
    """

    def __init__(self, root: PathLike, mirror: PathLike, *, encoding: str = "context", level: Optional[int] = None,
                 threads: int = 0, sync: bool = True, lock_timeout: Optional[float] = None,
                 background: bool = True) -> None:
        self.root = _path(root, "root")
        self.mirror = _path(mirror, "mirror")
        self.encoding = encoding
        self._lock = threading.Lock()
        threads = _count(threads, "threads") or 0  # as the forms check them: a negative number is a UsageError
        lock_timeout = _seconds(lock_timeout, "lock_timeout")
        self._core = _core._Publisher(self.root, self.mirror, encoding, level, threads, sync, lock_timeout,
                                      background)
        o = json.loads(self._core.opening())
        self.opening = Opening(version=o["version"], rolled_back=o["rolled_back"], caught_up=list(o["caught_up"]))

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        """One call at a time: a call of another thread meanwhile raises UsageError and changes nothing."""
        if not self._lock.acquire(blocking=False):
            raise UsageError("the publisher is in use by another thread")
        try:
            yield
        finally:
            self._lock.release()

    @property
    def version(self) -> int:
        """The newest version published (the mirror's, once advanced)."""
        with self._alone():
            return int(self._core.version)

    def publish(self, tensors: Tensors, *, unchanged: Union[Iterable[str], bool] = (),
                progress: Optional[ProgressCallback] = None, wait: bool = False) -> PublishResult:
        """Publishes version ``self.version + 1`` from ``tensors`` ((name, tensor) pairs, or a mapping), taken
        one at a time, in any order: every tensor of the mirror, except those named in ``unchanged`` (or all
        those not given, with ``unchanged=True``). Nothing is published if anything fails (the iterable
        raising included). ``wait``: also wait for the mirror's advance (its result in ``mirror``; if it fails,
        the version is published all the same and the error says so)."""
        pairs: Iterable[Tuple[str, TensorLike]] = tensors.items() if isinstance(tensors, Mapping) else tensors
        with self._alone():
            owned = not self._core.in_progress  # a version begun with begin()/put() is the caller's to abort
            try:  # the version begins inside put_all (and with it, its "publish" progress phase)
                self._core.put_all((_item(n, t) for n, t in pairs), progress)
                if isinstance(unchanged, str):
                    unchanged = [unchanged]
                if unchanged is not True and unchanged is not False:
                    for name in unchanged:
                        self._core.unchanged(name)
                return PublishResult._from_report(self._core.publish(unchanged is True, wait))
            except BaseException:
                if owned:
                    self._core.abort()
                raise

    # The same in steps, for a trainer that hands tensors over from callbacks.
    def begin(self) -> None:
        """Starts version ``self.version + 1`` (put() starts it too)."""
        with self._alone():
            self._core.begin()

    def put(self, name: str, tensor: TensorLike) -> None:
        """Diffs one tensor of the version begun against the mirror."""
        with self._alone():
            self._core.put(*_item(name, tensor))

    def declare_unchanged(self, names: Iterable[str]) -> None:
        """Declares tensors unchanged since the mirror's version (they are not read)."""
        with self._alone():
            for name in [names] if isinstance(names, str) else names:
                self._core.unchanged(name)

    def commit(self, *, rest_unchanged: bool = False, wait: bool = False) -> PublishResult:
        """Publishes the version begun (every tensor given or declared unchanged; ``rest_unchanged``: those not
        given are). On a missing tensor it raises UsageError and keeps the version open."""
        with self._alone():
            return PublishResult._from_report(self._core.publish(rest_unchanged, wait))

    def abort(self) -> None:
        """Abandons the version begun: nothing is published."""
        with self._alone():
            self._core.abort()

    def wait(self) -> Optional[ChangeResult]:
        """Waits for the mirror's advance; its result, or None if none ran since the last wait. Its failure is
        raised once (the version stays published; the next publish catches the mirror up from the root)."""
        with self._alone():
            text = self._core.wait()
        return ChangeResult._from_json(text) if text is not None else None

    def close(self) -> None:
        """Abandons a version begun, waits for the mirror, releases the mirror's publisher lock. Call it (or use
        the publisher as a context manager): a publisher dropped without it waits for the mirror's advance with
        the GIL held."""
        with self._alone():
            self._core.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

