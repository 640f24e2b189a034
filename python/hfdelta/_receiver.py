"""The engine side of hfdelta's weight-transfer backend, apart from any engine.

One :class:`Receiver` lives in each worker process of an engine (hfdelta.vllm
creates it). It brings the worker's host-local checkpoint LOCAL to the version a
trainer asks for, with hfdelta's own pull (journalled, under LOCAL's flock: the
lock a systemd puller on the same host takes), and then has the engine reload
from LOCAL while holding a *shared* flock on it, so that no pull can patch LOCAL
while the engine reads it, and the workers of one engine on one host (tensor
parallel) reload side by side.

Two steps, so that the engine pauses for the reload only:

- ``stage(version)``: the pull, in a thread of its own, while the engine still
  serves the weights it holds in memory; it returns at once (an engine calls it
  from its scheduling loop) and ``state()`` tells how far it is;
- ``update(version, reload)``: waits for a staging of that version under way,
  checks under the shared lock that LOCAL holds exactly that version (pulling
  first if it does not: not staged), and calls ``reload(LOCAL)``.

Staging early is safe only if the engine keeps no mapping of LOCAL's files once
its weights are loaded (a pull patches them in place). ``state()`` lists the
files of LOCAL mapped in this process; where there are any, ``stage`` leaves the
pull to ``update`` (inside the pause) and says so.

A *claim* keeps two callers (two trainers) from driving one engine at once: a
caller passes an ``owner`` token with each call, the first ``stage`` claims the
engine for its version, and another owner is refused, with the version and the
owner holding it, until the claim is released or unused for ``claim_timeout``
seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

from . import _api
from .errors import BadInput, HfdeltaError, LockTimeout, OutOfOrder, UsageError
from .results import PullResult, StatusResult

__all__ = ["Receiver", "version_number", "version_name"]

Version = Union[int, str]


def version_number(version: Version) -> int:
    """A version as an int: 3, "3", "000003" and "weight_v000003" are version 3."""
    if isinstance(version, bool):
        raise UsageError(f"version must be an integer >= 0, not {version!r}")
    if isinstance(version, int):
        if version < 0:
            raise UsageError(f"version must be an integer >= 0, not {version!r}")
        return version
    if isinstance(version, str):
        m = re.fullmatch(r"(?:weight_v)?(\d{1,18})", version.strip())
        if m:
            return int(m.group(1))
    raise UsageError(f"version must be an integer >= 0 (3, \"000003\"), not {version!r}")


def version_name(version: Version) -> str:
    """The six-digit name of a version ("000003"), as delta-apply and /weight_info show it."""
    return f"{version_number(version):06d}"


def _check_not_withdrawn(root: str, local: str, v: int) -> None:
    """Refuses to reload a version withdrawn since it was pulled (delta-diff --withdraw renames
    ROOT/weight_vNNNNNN to withdrawn_vNNNNNN): the engine keeps the weights it holds."""
    if os.path.lexists(os.path.join(root, f"withdrawn_v{version_name(v)}")):
        raise OutOfOrder(f"hfdelta: version {version_name(v)} was withdrawn from {root} after {local} pulled it; "
                         "nothing was reloaded, the engine keeps serving the weights it holds (publish a newer "
                         "version and bring the engine to it)", path=root)


@dataclass
class _Stage:
    version: int
    started: float
    thread: Optional[threading.Thread] = None
    ended: Optional[float] = None
    error: Optional[str] = None
    deferred: Optional[str] = None  # why the pull is left to update()
    result: Optional[PullResult] = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.ended is None

    def to_dict(self) -> dict[str, Any]:
        if self.deferred is not None:
            state = "deferred"
        elif self.ended is None:
            state = "running"
        else:
            state = "failed" if self.error is not None else "done"
        end = self.ended if self.ended is not None else time.monotonic()
        out: dict[str, Any] = {"version": version_name(self.version), "state": state,
                               "seconds": round(end - self.started, 6), "error": self.error,
                               "deferred": self.deferred}
        if self.result is not None:
            out.update(applied=self.result.applied, fallback=self.result.fallback,
                       from_version=self.result.from_version, pull_seconds=self.result.seconds)
        return out


@dataclass
class _Claim:
    owner: str
    version: int
    since: float
    touched: float = field(default=0.0)


class Receiver:
    """Brings LOCAL to the versions asked for and has the engine reload them (see the module's doc).

    ``served``: the directory the engine was launched on, LOCAL unless ``init`` names another. Every method is
    safe to call from several threads; none but ``update`` waits for a pull.
    """

    def __init__(self, served: Optional[str] = None, *, claim_timeout: float = 600.0) -> None:
        self._served_dir = served
        self._claim_timeout = claim_timeout
        self._mu = threading.Lock()
        self._root: Optional[str] = None
        self._local: Optional[str] = None
        self._lock_timeout: Optional[float] = 300.0
        self._threads = 0
        self._stage: Optional[_Stage] = None
        self._claim: Optional[_Claim] = None
        self._serving: Optional[str] = None  # the version last reloaded (None: what the engine started on)
        self._last: Optional[dict[str, Any]] = None
        self._updating = False

    # ---- set-up ----

    def init(self, root: str, local: Optional[str] = None, *, lock_timeout: Optional[float] = 300.0,
             threads: int = 0) -> dict[str, Any]:
        """Names the publication root and LOCAL (default: the directory the engine was launched on). Calling it
        again with the same paths changes nothing; other paths are refused while a staging or update is under
        way."""
        root_s = _api._path(root, "root")
        local_s = _api._path(local, "local") if local is not None else self._served_dir
        if local_s is None:
            raise UsageError("hfdelta: init_info names no local, and the engine's model directory is unknown: "
                             "give init_info {\"root\": ROOT, \"local\": LOCAL}")
        if not os.path.isdir(root_s):
            raise BadInput(f"hfdelta: the publication root {root_s} is not a directory on this host "
                           f"({socket.gethostname()}): mount it here, or give the path it has here", path=root_s)
        if not os.path.isdir(local_s):
            raise BadInput(f"hfdelta: LOCAL {local_s} is not a directory on this host ({socket.gethostname()}); "
                           "the engine must serve a LOCAL set up with delta-apply --init (or name it in init_info's "
                           "\"local\")", path=local_s)
        try:  # one try, not a look at the lock first: a pull may take it between the look and the read
            st: Optional[StatusResult] = _api.status(local_s, lock_timeout=0)
        except LockTimeout:
            st = None  # a pull holds LOCAL's lock, so it is a LOCAL
        if st is not None and st.state == "uninitialised":
            raise BadInput(f"hfdelta: {local_s} is not an hfdelta LOCAL (no .weight_sync/state.json): set it up once "
                           f"with hfdelta.init(CHECKPOINT, {local_s!r}) (delta-apply --init), from the checkpoint "
                           "the engine was launched with", path=local_s)
        root_s, local_s = os.path.realpath(root_s), os.path.realpath(local_s)
        with self._mu:
            busy = self._updating or (self._stage is not None and self._stage.running) or self._live_claim()
            if busy and (root_s, local_s) != (self._root, self._local):
                raise UsageError(f"hfdelta: a staging or update from {self._root} into {self._local} is under way "
                                 "(or claimed by a caller); init again with other paths once it is over")
            self._root, self._local = root_s, local_s
            self._lock_timeout = _api._seconds(lock_timeout, "lock_timeout")
            self._threads = _api._count(threads, "threads") or 0
        return self.state()

    def _paths(self) -> tuple[str, str]:
        if self._root is None or self._local is None:
            raise UsageError("hfdelta: no publication root yet: call /init_weight_transfer_engine with "
                             "{\"init_info\": {\"root\": ROOT}} first")
        return self._root, self._local

    # ---- claims ----

    def _live_claim(self) -> Optional[_Claim]:
        """The claim, unless unused for claim_timeout with nothing under way (then dropped). Holds _mu."""
        c = self._claim
        running = self._updating or (self._stage is not None and self._stage.running)
        if c is not None and not running and time.monotonic() - c.touched > self._claim_timeout:
            self._claim = c = None
        return c

    def _check_claim(self, owner: Optional[str], version: int, take: bool) -> None:
        """Raises if another owner holds a live claim; with ``take``, claims the engine for ``owner``. Holds _mu."""
        now = time.monotonic()
        c = self._live_claim()
        if c is not None and c.owner != owner:
            raise OutOfOrder(f"hfdelta: this engine is being brought to version {version_name(c.version)} by another "
                             f"caller ({c.owner}, for {now - c.since:.0f} s); refused version {version_name(version)}. "
                             "Two callers must not drive one engine at once: let that one finish (its claim ends "
                             f"with its update, or {self._claim_timeout:.0f} s after its last call), then ask again")
        if c is not None:
            c.touched = now
            if take:
                c.version = version
        elif take and owner is not None:
            self._claim = _Claim(owner=owner, version=version, since=now, touched=now)

    def release(self, owner: str) -> dict[str, Any]:
        """Ends ``owner``'s claim, if it holds one."""
        with self._mu:
            if self._claim is not None and self._claim.owner == owner:
                self._claim = None
        return self.state()

    # ---- staging ----

    def stage(self, version: Version, owner: Optional[str] = None) -> dict[str, Any]:
        """Starts bringing LOCAL to ``version`` in a thread of its own and returns at once (``state()["stage"]``
        tells how it goes). Staging the version already staged or being staged changes nothing."""
        v = version_number(version)
        self._paths()
        with self._mu:
            self._check_claim(owner, v, take=True)
            s = self._stage
            if s is not None and s.running:
                if s.version != v:
                    raise OutOfOrder(f"hfdelta: staging of version {version_name(s.version)} is under way; refused "
                                     f"version {version_name(v)}: ask again once it is over")
                return self._state_locked()
            if s is not None and s.version == v and s.ended is not None and s.error is None and s.deferred is None:
                return self._state_locked()
            s = _Stage(version=v, started=time.monotonic())
            mapped = self.mapped_files()
            if mapped:
                s.deferred = (f"{len(mapped)} file(s) of LOCAL are mapped by this process ({mapped[0]}, ...): a pull "
                              "patches them in place, which would change the weights being served, so the pull is "
                              "left to the update, inside the pause")
                self._stage = s
                return self._state_locked()
            s.thread = threading.Thread(target=self._run_stage, args=(s,), name=f"hfdelta-stage-{v:06d}", daemon=True)
            self._stage = s
            s.thread.start()
            return self._state_locked()

    def _run_stage(self, s: _Stage) -> None:
        try:
            s.result = self._pull(s.version)
        except BaseException as e:  # reported through state(), and again by update()
            s.error = str(e)
        finally:
            s.ended = time.monotonic()

    def _pull(self, v: int) -> PullResult:
        """LOCAL to version v (hfdelta.pull under LOCAL's lock), the library's errors made to say what the engine
        keeps."""
        root, local = self._paths()
        try:
            r = _api.pull(root, local, target=v, lock_timeout=self._lock_timeout, threads=self._threads)
        except HfdeltaError as e:
            held = _local_version(local)
            err = type(e)(f"hfdelta: cannot bring {local} to version {version_name(v)} from {root}: {e.message} "
                          f"(LOCAL keeps version {held}; the engine keeps serving the weights it holds)",
                          exit_code=e.exit_code, kind=e.kind, path=e.path)
            raise err from e
        if r.to_version != version_name(v):  # a version cut short (no completion yet), or not published yet
            why = r.waiting_for or r.not_published_yet
            raise OutOfOrder(f"hfdelta: {root} does not hold a complete version {version_name(v)} yet"
                             + (f" (waiting for {why})" if why else "")
                             + f"; {local} stays at version {r.to_version} and the engine keeps serving the weights "
                             "it holds", path=root)
        return r

    # ---- the update ----

    def update(self, version: Version, reload: Callable[[str], None], owner: Optional[str] = None) -> dict[str, Any]:
        """Brings LOCAL to ``version`` and calls ``reload(LOCAL)`` while holding a shared flock on LOCAL, once
        LOCAL holds exactly that version: waits for its staging if under way, and pulls only if LOCAL does not
        hold it yet (so that the workers of one host, each calling this, reload side by side). A reload that
        raises is tried once more (a failed reload may leave the engine's weights partly loaded); if that raises
        too, the error says the engine must be restarted. Returns the timings."""
        v = version_number(version)
        root, local = self._paths()
        t0 = time.monotonic()
        with self._mu:
            self._check_claim(owner, v, take=owner is not None)
            if self._updating:
                raise OutOfOrder(f"hfdelta: an update of this engine is under way; refused version {version_name(v)}")
            self._updating = True
            s = self._stage
        try:
            staged = s is not None and s.version == v and s.deferred is None
            if staged and s is not None and s.thread is not None:
                s.thread.join()
            pull_s, applied, fallback = 0.0, [], None
            reload_s, retried = 0.0, None
            for attempt in (1, 2):
                with _shared_lock(local, self._lock_timeout):
                    st = _api.status(local, lock_timeout=self._lock_timeout)
                    if st.state == "clean" and st.version == version_name(v):
                        _check_not_withdrawn(root, local, v)  # at the reload: a stage may be long past
                        t_reload = time.monotonic()
                        retried = self._reload(reload, local, v)
                        reload_s = time.monotonic() - t_reload
                        break
                if attempt == 2:
                    raise OutOfOrder(f"hfdelta: {local} was at version {version_name(v)} after the pull, but is "
                                     f"{st.state} at version {st.version} now: another pull on this host moved it "
                                     "(a second caller, or a puller on a timer); nothing was reloaded, the engine "
                                     "keeps serving the weights it holds", path=local)
                # Not staged (or staged by nobody yet): the pull, under LOCAL's exclusive lock, then look again.
                # (Pulling only when needed lets the workers of one host reload side by side.)
                t_pull = time.monotonic()
                r = self._pull(v)
                pull_s, applied, fallback = time.monotonic() - t_pull, r.applied, r.fallback
            self._serving = version_name(v)
            report = {"version": version_name(v), "staged": staged and (s is not None and s.error is None),
                      "stage_seconds": s.to_dict()["seconds"] if staged and s is not None else None,
                      "pull_seconds": round(pull_s, 6), "applied_in_update": applied,
                      "reload_seconds": round(reload_s, 6), "update_seconds": round(time.monotonic() - t0, 6),
                      "reload_retried_after": retried, "fallback": fallback}
            with self._mu:
                self._last = report
            return report
        finally:
            with self._mu:
                self._updating = False

    def _reload(self, reload: Callable[[str], None], local: str, v: int) -> Optional[str]:
        """reload(LOCAL), tried once more if it raises (a failed reload may leave the weights partly loaded);
        the first error if it took two tries."""
        try:
            reload(local)
            return None
        except Exception as first:
            try:
                reload(local)
            except Exception as second:
                self._serving = None
                raise HfdeltaError(f"hfdelta: reloading version {version_name(v)} from {local} failed twice "
                                   f"({first!r}; then {second!r}): the engine's weights may be partly of the new "
                                   "version; restart the engine on LOCAL", path=local) from second
            return str(first) or repr(first)

    # ---- what is going on ----

    def mapped_files(self) -> list[str]:
        """The files of LOCAL mapped into this process (Linux: /proc/self/maps; elsewhere an empty list)."""
        local = self._local
        if local is None:
            return []
        prefix = local.rstrip("/") + "/"
        found: set[str] = set()
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].strip()
                        if path.endswith(" (deleted)"):
                            path = path[: -len(" (deleted)")]
                        if path.startswith(prefix):
                            found.add(path)
        except OSError:
            return []
        return sorted(found)

    def state(self, owner: Optional[str] = None) -> dict[str, Any]:
        """Where this worker stands, for the caller's polls: paths, LOCAL's version (None while a pull holds its
        lock), the staging, the claim, the version last reloaded, the last update's timings, LOCAL's files mapped
        here. A poll by the claim's owner keeps its claim alive."""
        with self._mu:
            if owner is not None and self._claim is not None and self._claim.owner == owner:
                self._claim.touched = time.monotonic()
            return self._state_locked()

    def _state_locked(self) -> dict[str, Any]:
        now = time.monotonic()
        c = self._claim
        return {
            "host": socket.gethostname(), "pid": os.getpid(),
            "root": self._root, "local": self._local,
            "local_version": _local_version(self._local) if self._local is not None else None,
            "serving": self._serving,
            "stage": self._stage.to_dict() if self._stage is not None else None,
            "updating": self._updating,
            "claim": None if c is None else {"owner": c.owner, "version": version_name(c.version),
                                             "seconds": round(now - c.since, 3)},
            "last_update": self._last,
            "mapped": self.mapped_files(),
        }


def _local_version(local: str) -> Optional[str]:
    """LOCAL's version, or None when a pull holds its lock or it cannot be read (never waits for the lock)."""
    try:
        st = _api.status(local, lock_timeout=0)
    except HfdeltaError:
        return None
    return st.version if st.state == "clean" else f"{st.state}:{st.version}"


@contextlib.contextmanager
def _shared_lock(local: str, timeout: Optional[float]) -> Iterator[None]:
    """A shared flock on LOCAL/.weight_sync/lock (delta-apply --status and --verify take the same): no pull
    patches LOCAL while it is held, and several readers hold it at once."""
    path = os.path.join(local, ".weight_sync", "lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise BadInput(f"hfdelta: {path}: {e.strerror}: {local} is not an hfdelta LOCAL (set it up with "
                       "hfdelta.init)", path=local) from None
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeout(f"hfdelta: {path}: still locked by a pull after {timeout:g} s; nothing was "
                                      "reloaded", path=path) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
