"""Publishing one version from every rank of a sharded trainer, with no gather (docs/sharded.md).

Every rank of the trainer holds a ``ShardedPublisher(root, mirror, group=...)`` and gives it the
pieces it holds: an HF tensor name, the local tensor, and where the piece sits in the full tensor
(a row range, a column range, the whole tensor; or a torch DTensor, whose placements say it).
``publish()`` is a collective call: every rank diffs its own pieces against its own ranges of its
host's mirror and writes the parts of the version's entries it owns; rank 0 commits the version
in one rename; each host's first rank advances that host's mirror. No rank reads, receives or
holds a piece it does not hold: what crosses ranks is the plan (names and ranges), the mirrors'
versions and checksums, the staging directory's name and the part records.

The collectives are the trainer's own (``torch.distributed``, gloo or NCCL: ``all_gather_object``
on ``group``); the C++ core (hfdelta._core) knows nothing of torch. Every step ends with every
rank learning whether any rank failed in it, so an error on one rank (a gap in the plan, a wrong
dtype, a full disk) is raised on every rank, with the same class and message, and nothing is
published.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

from . import _core, errors
from ._api import ENCODINGS, PathLike, _count, _path, _seconds
from .errors import HfdeltaError, UsageError
from .publisher import TensorLike, _item

__all__ = ["ShardedPublisher", "ShardedResult"]

Range = Tuple[int, int]


@dataclass(frozen=True)
class ShardedResult:
    """One version published by every rank: the same ``version``, ``out``, ``tensors_changed`` and
    ``delta_bytes`` on every rank; ``pieces``, ``pieces_kept`` and ``mirror_bytes_read`` are this rank's
    (a replicated piece is written by one of its holders only: ``pieces_kept`` counts those this rank
    wrote); ``mirror`` is the mirror's apply (the CLI's ``--json`` object) on a host's first rank, else
    None; ``seconds``: the call's wall time on this rank."""
    version: int
    base_version: int
    out: str
    tensors_changed: int
    delta_bytes: int
    pieces: int
    pieces_kept: int
    mirror_bytes_read: int
    mirror: Optional[dict[str, Any]]
    seconds: float


@dataclass
class _Piece:
    name: str
    array: Any
    dtype: Optional[str]
    shape: list[int]  # the full tensor's
    region: Tuple[int, int, int, int]  # row0, rows, col0, cols of the tensor seen as a matrix
    replicated: bool


def _dist() -> Any:
    try:  # imported by name: the package itself (and its type check) needs no torch
        dist = importlib.import_module("torch.distributed")
    except ImportError as e:  # pragma: no cover - the package itself does not need torch
        raise UsageError("ShardedPublisher needs torch.distributed (pip install torch)") from e
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("ShardedPublisher: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group() first (gloo or nccl)")
    return dist


def _failure(e: BaseException) -> Tuple[str, int, str, str, Optional[str]]:
    """What a rank tells the others of its failure: (class name, exit code, kind, message, path)."""
    if isinstance(e, HfdeltaError):
        return type(e).__name__, e.exit_code, e.kind, e.message, e.path
    return type(e).__name__, 1, "failure", f"{type(e).__name__}: {e}", None


def _raise(rank: int, step: str, f: Tuple[str, int, str, str, Optional[str]], extra: str) -> None:
    name, code, kind, message, path = f
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, HfdeltaError)):
        cls = HfdeltaError
    raise cls(f"rank {rank} ({step}): {message}{extra}", exit_code=code, kind=kind, path=path)


class ShardedPublisher:
    """Publishes versions into ``root`` from the pieces every rank of ``group`` holds, diffed against
    each host's ``mirror`` (a LOCAL, ``hfdelta.init(CHECKPOINT, MIRROR)``, holding the last published
    version; one per host, shared by that host's ranks). Created and used collectively: every rank of
    ``group`` (default: the world) calls the constructor, ``publish()`` and ``close()`` in the same order.

    ``host``: the name that groups ranks onto one mirror (default: ``socket.gethostname()``); the
    ranks of one host must name the same mirror, and each host's first rank (its *leader*) opens it:
    the mirror's publisher lock (``lock_timeout`` seconds, None: forever) and the reconciliation of a
    ``Publisher`` (an interrupted advance rolled back, a mirror behind ROOT caught up). Then the
    leaders compare their mirrors' versions and checksum records: mirrors that disagree are refused
    on every rank (OutOfOrder), naming the hosts and saying which to re-create.

    ``encoding``: "context" (default), "sparse" or "xor", each part's (see docs/sharded.md: a sharded
    version is made of ``parts`` entries, format revision 6).
    """

    def __init__(self, root: PathLike, mirror: PathLike, *, group: Any = None, host: Optional[str] = None,
                 encoding: str = "context", level: Optional[int] = None, threads: int = 0, sync: bool = True,
                 lock_timeout: Optional[float] = None) -> None:
        dist = _dist()
        self.root = _path(root, "root")
        self.mirror = _path(mirror, "mirror")
        self.encoding = encoding
        self.level = level
        self.sync = sync
        self._dist, self._group = dist, group
        self.rank = dist.get_rank(group) if group is not None else dist.get_rank()
        self.world = dist.get_world_size(group) if group is not None else dist.get_world_size()
        self.host = host if host is not None else socket.gethostname()
        self._mirror: Any = None
        self._layout: dict[str, Tuple[str, list[int]]] = {}
        self._pieces: list[_Piece] = []
        threads = _count(threads, "threads") or 0
        lock_timeout = _seconds(lock_timeout, "lock_timeout")
        part_encodings = [e.name for e in ENCODINGS if e.in_parts]
        if encoding not in part_encodings:
            raise UsageError(f"ShardedPublisher: encoding {encoding!r}: a sharded version's parts are "
                             f"{', '.join(part_encodings[:-1])} or {part_encodings[-1]}")

        where = self._agree("hosts", lambda: (self.host, os.path.realpath(self.mirror)))
        self._leaders = self._check_hosts(where)
        self.leader = self._leaders[self.host] == self.rank

        def open_mirror() -> Optional[dict[str, Any]]:
            self._layout = {n: (d, list(s)) for n, d, s in _core._mirror_layout(self.mirror)}
            if not self.leader:
                return None
            self._mirror = _core._ShardMirror(self.root, self.mirror, threads, sync, lock_timeout)
            opening: dict[str, Any] = json.loads(self._mirror.opening())
            return opening

        openings = self._agree("open the mirror", open_mirror)
        self.opening = openings[self.rank] if self.leader else openings[self._leaders[self.host]]
        self.version = self._mirrors_agree()

    # ---- collectives -----------------------------------------------------------------------------

    def _agree(self, step: str, fn: Callable[[], Any], cleanup: Optional[Callable[[], None]] = None,
               extra: str = "") -> list[Any]:
        """Runs ``fn`` on this rank and gathers every rank's outcome: the list of their results, or
        the first failure (by rank) raised on every rank, after ``cleanup``."""
        try:
            mine: Tuple[bool, Any] = (True, fn())
        except Exception as e:  # every rank must hear of it, or the others wait forever
            mine = (False, _failure(e))
        everyone: list[Any] = [None] * self.world
        self._dist.all_gather_object(everyone, mine, group=self._group)
        for rank, (ok, value) in enumerate(everyone):
            if not ok:
                if cleanup is not None:
                    cleanup()
                _raise(rank, step, value, extra)
        return [value for _, value in everyone]

    def _check_hosts(self, where: list[Tuple[str, str]]) -> dict[str, int]:
        leaders: dict[str, int] = {}
        mirrors: dict[str, str] = {}
        for rank, (host, mirror) in enumerate(where):
            leaders.setdefault(host, rank)
            if mirrors.setdefault(host, mirror) != mirror:
                raise UsageError(f"ShardedPublisher: ranks {leaders[host]} and {rank} of host {host!r} name two "
                                 f"mirrors ({mirrors[host]}, {mirror}); the ranks of one host share one mirror")
        owners = {m: h for h, m in mirrors.items()}
        if len(owners) != len(mirrors):
            hosts = sorted(h for h in mirrors if owners[mirrors[h]] != h)
            raise UsageError(f"ShardedPublisher: hosts {hosts} name a mirror another host names; each host has its "
                             "own mirror (give host= the same name on ranks that share one)")
        return leaders

    def _mirrors_agree(self) -> int:
        """Each leader's mirror reconciled with ROOT; their versions and checksum records must agree."""
        def state() -> Optional[Tuple[int, str]]:
            if not self.leader:
                return None
            version = int(self._mirror.reconcile())
            return version, self._mirror.record_digest()

        states = self._agree("reconcile the mirror", state)
        held = {host: states[rank] for host, rank in self._leaders.items()}
        if len(set(held.values())) > 1:
            newest = max(v for v, _ in held.values())
            lines = "; ".join(f"host {h} at version {v} (record {d[:12]})" for h, (v, d) in sorted(held.items()))
            raise errors.OutOfOrder(
                f"the hosts' mirrors disagree: {lines}; nothing was published. Re-create each mirror that is "
                f"not the publication root's version {newest} from the root (delta-apply --init CHECKPOINT MIRROR, "
                "then delta-apply --root ROOT MIRROR)", path=self.root)
        version: int = next(iter(held.values()))[0]
        return version

    # ---- pieces ----------------------------------------------------------------------------------

    def put(self, name: str, tensor: TensorLike, *, rows: Optional[Range] = None, cols: Optional[Range] = None,
            replicated: bool = False) -> None:
        """Gives a piece of tensor ``name`` this rank holds, for the next ``publish()``: ``rows`` = (start,
        stop) of its first dimension, ``cols`` = (start, stop) of its second (for a tensor of 2 or more
        dimensions: every later dimension whole), neither: the whole tensor. A torch DTensor (FSDP2's
        parameters, ``distribute_tensor``) says where its local shard sits by its placements
        (``Shard(0)``, ``Shard(1)``, ``Replicate()``); give it without ``rows``/``cols``. ``replicated``:
        other ranks give the same piece (a ``Replicate`` placement); one of them writes it. The tensor is
        kept by reference until ``publish()`` reads it, each byte once: what the trainer writes into it
        meanwhile is in the version chunk by chunk as each was read, and every host applies the version
        (docs/sharded.md, "A piece written during publish()"); give a copy to publish one step's weights."""
        if not isinstance(name, str):
            raise UsageError(f"tensor names are str, not {type(name).__name__}")
        if name not in self._layout:
            raise errors.Unsupported(f"rank {self.rank}: tensor '{name}' is not in mirror {self.mirror}; a sharded "
                                     "publisher patches the mirror's tensors only (publish a new tensor set as a "
                                     "full version: delta-diff --full)", path=self.mirror)
        dtype, shape = self._layout[name]
        if hasattr(tensor, "placements") and hasattr(tensor, "to_local"):
            if rows is not None or cols is not None:
                raise UsageError(f"tensor '{name}': a DTensor says where its shard sits; give no rows= or cols=")
            where = self._dtensor_region(name, tensor, shape)
            if where is not None:
                self._add(name, tensor.to_local(), shape, *where)
            return
        r0, r1 = rows if rows is not None else (0, shape[0] if shape else 1)
        c0, c1 = cols if cols is not None else (0, shape[1] if len(shape) >= 2 else 1)
        if cols is not None and len(shape) < 2:
            raise UsageError(f"tensor '{name}': cols= needs a tensor of 2 or more dimensions, it has shape {shape}")
        inner = 1
        for d in shape[2:]:
            inner *= d
        self._add(name, tensor, shape, r0, r1 - r0, c0 * inner, (c1 - c0) * inner, replicated)

    def _dtensor_region(self, name: str, t: Any, shape: list[int]) -> Optional[Tuple[int, int, int, int, bool]]:
        """Where a DTensor's local shard sits: (row0, rows, col0, cols, replicated); None for an empty shard."""
        tensor_mod = importlib.import_module("torch.distributed.tensor")
        Replicate, Shard = tensor_mod.Replicate, tensor_mod.Shard
        if list(t.shape) != shape:
            raise errors.Unsupported(f"rank {self.rank}: tensor '{name}': shape {list(t.shape)}, but mirror "
                                     f"{self.mirror} holds {shape}", path=self.mirror)
        local_shape, offset = _local_shape_and_offset(t)
        replicated = False
        for p in t.placements:
            if isinstance(p, Replicate):
                replicated = True
            elif isinstance(p, Shard):
                if p.dim not in (0, 1):
                    raise UsageError(f"tensor '{name}': sharded on dimension {p.dim}; a sharded publisher takes "
                                     "row (Shard(0)) and column (Shard(1)) shards; give its pieces with put(rows=, "
                                     "cols=) from a layout of those")
            else:
                raise UsageError(f"tensor '{name}': placement {p} (partial sums are not weights); reduce it first")
        if any(n == 0 for n in local_shape) and shape and all(n > 0 for n in shape):
            return None  # an empty shard (uneven split): this rank holds nothing of it
        inner = 1
        for d in shape[2:]:
            inner *= d
        rows = local_shape[0] if shape else 1
        row0 = offset[0] if shape else 0
        if len(shape) >= 2:
            col0, cols = offset[1] * inner, local_shape[1] * inner
        else:
            col0, cols = 0, 1
        return row0, rows, col0, cols, replicated

    def _add(self, name: str, tensor: TensorLike, shape: list[int], row0: int, rows: int, col0: int, cols: int,
             replicated: bool) -> None:
        _, array, dtype, _ = _item(name, tensor)
        if hasattr(array, "__dlpack_device__") and array.__dlpack_device__()[0] != 1:
            raise UsageError(f"tensor '{name}': a sharded publisher takes pieces in host memory; copy it to "
                             "the host first (torch: .cpu())")
        self._pieces.append(_Piece(name, array, dtype, shape, (row0, rows, col0, cols), replicated))

    # ---- publishing ------------------------------------------------------------------------------

    def publish(self, tensors: Union[Mapping[str, TensorLike], Iterable[Tuple[str, TensorLike]], None] = None
                ) -> ShardedResult:
        """Publishes version ``self.version + 1`` from the pieces given by ``put()`` and ``tensors``
        ((name, tensor) pairs or a mapping, e.g. an FSDP2 model's ``state_dict()``: DTensors, or whole
        tensors this rank holds alone) on every rank. Every element of every mirror tensor must be given
        by exactly one rank (a replicated piece by one of its holders): a gap, an overlap, or a name,
        dtype or shape the mirror lacks raises on every rank, and nothing is published. Collective."""
        t0 = time.monotonic()
        if tensors is not None:
            pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
            for name, t in pairs:
                self.put(name, t)
        pieces, self._pieces = self._pieces, []
        keep = self._plan(pieces)
        base = self._mirrors_agree()
        version = base + 1
        stage = self._agree("stage the version",
                            lambda: _core._make_shard_stage(self.root, version) if self.rank == 0 else None)[0]

        def drop_stage() -> None:
            if self.rank == 0:
                shutil.rmtree(stage, ignore_errors=True)

        nothing = "; nothing was published"
        read = [0]

        def write_parts() -> str:
            w = _core._ShardWriter(self.mirror, stage, self.rank, self.encoding, self.level)
            try:
                for p in keep:
                    w.put(p.name, p.array, p.dtype, p.shape, *p.region)
                text = w.finish(self.sync)
                read[0] = int(w.mirror_bytes_read)
                return text
            finally:
                w.close()

        texts = self._agree("write its parts", write_parts, drop_stage, nothing)

        def commit() -> Optional[dict[str, Any]]:
            if self.rank != 0:
                return None
            try:
                out: dict[str, Any] = json.loads(_core._commit_sharded(self.root, self.mirror, stage, version, base,
                                                                       "".join(texts), self.sync))
                return out
            except Exception:
                drop_stage()
                raise

        done = self._agree("commit the version", commit, extra=nothing)[0]

        def advance() -> Optional[dict[str, Any]]:
            if not self.leader:
                return None
            result: dict[str, Any] = json.loads(self._mirror.advance(done["out"]))
            return result

        applied = self._agree("advance the mirror", advance,
                              extra=f"; version {version} is published all the same ({done['out']}), and the next "
                                    "publish catches the mirror up from the root")
        self.version = version
        return ShardedResult(version=version, base_version=base, out=done["out"],
                             tensors_changed=int(done["tensors_changed"]), delta_bytes=int(done["delta_bytes"]),
                             pieces=len(pieces), pieces_kept=len(keep), mirror_bytes_read=read[0],
                             mirror=applied[self.rank], seconds=time.monotonic() - t0)

    def _plan(self, pieces: Sequence[_Piece]) -> list[_Piece]:
        """Every rank's pieces gathered and checked against the mirror (the same check, and error, on every
        rank); a replicated piece is kept by the lowest of the ranks that give it."""
        mine = [(p.name, *p.region, p.replicated) for p in pieces]
        everyone = self._agree("list its pieces", lambda: mine)
        owner: dict[Tuple[Any, ...], int] = {}
        plan = []
        for rank, listed in enumerate(everyone):
            for name, row0, rows, col0, cols, replicated in listed:
                key = (name, row0, rows, col0, cols)
                if replicated and key in owner:
                    continue  # another holder of the same replicated piece writes it
                if replicated:
                    owner[key] = rank
                plan.append((name, row0, rows, col0, cols, rank))
        self._agree("check the plan", lambda: _core._check_shard_plan(self.mirror, plan),
                    extra="; nothing was published")
        return [p for p in pieces if not p.replicated or owner[(p.name, *p.region)] == self.rank]

    def close(self) -> None:
        """Lets the mirror go (its publisher lock); collective, as the constructor."""
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None

    def __enter__(self) -> "ShardedPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _local_shape_and_offset(t: Any) -> Tuple[list[int], list[int]]:
    """Where a DTensor's local shard sits in the full tensor: torch's own computation of it."""
    try:
        utils = importlib.import_module("torch.distributed.tensor._utils")
    except ImportError:  # pragma: no cover - older torch
        utils = importlib.import_module("torch.distributed._tensor._utils")
    shape, offset = utils.compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return [int(n) for n in shape], [int(o) for o in offset]
