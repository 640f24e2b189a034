"""The trainer's side: bring vLLM engines that serve with the hfdelta backend to a version.

After publishing version N (``Publisher.publish``, ``ShardedPublisher.publish``, ``delta-diff``), a trainer
calls ``Engines(urls, root=ROOT).update(N)``: it returns once every engine serves N (``/weight_info``), with
each engine's timings, or raises :class:`EngineUpdateError` naming each engine that failed and why. Each
engine runs ``hfdelta.vllm`` (``--worker-extension-cls hfdelta.vllm.WorkerExtension
--weight-transfer-config '{"backend": "hfdelta"}'``, ``VLLM_SERVER_DEV_MODE=1``).

For each engine, over vLLM's HTTP routes:

1. ``GET /weight_info``: an engine that serves N already is left alone; one that serves a newer version
   is an error (an engine never goes back);
2. the stage, on every engine at once, while they all keep serving: ``POST /init_weight_transfer_engine``
   (the root), ``POST /collective_rpc`` ``hfdelta_stage`` (each worker pulls N into its host's LOCAL in a
   thread of its own), then ``hfdelta_state`` polled until every worker has it;
3. the pause, on every engine at once (default) or one engine after another (``rolling=True``, so that
   all but one keep serving): ``/pause?mode=wait``, ``/start_weight_update``, ``/update_weights``
   (the reload from LOCAL), ``/finish_weight_update`` with the version, ``/reset_prefix_cache``, and
   ``/resume``: always, once ``/pause`` was sent, whatever failed;
4. ``GET /weight_info`` again: it must say N.

An engine whose stage fails is never paused; the others go on. A claim token sent with every call keeps
a second caller (another trainer) from driving the same engine at the same time: it is refused, naming
the version the first is bringing, and the claim is released at the end.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from ._api import PathLike, _path
from ._receiver import Version, version_name, version_number

__all__ = ["Engines", "EngineResult", "EngineUpdateError", "EngineRequestError"]


class EngineRequestError(Exception):
    """One HTTP request to an engine failed: no answer, or an answer other than 2xx (``status``)."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class EngineResult:
    """What happened on one engine. Seconds are measured by the caller, but ``pull_seconds`` and
    ``reload_seconds``, which the engine's workers report (the largest over its workers)."""
    url: str
    version: str
    ok: bool = False
    skipped: bool = False  # it served the version already
    served_before: Optional[str] = None
    served_after: Optional[str] = None
    stage_seconds: Optional[float] = None  # hfdelta_stage sent to every worker staged (the engine serving)
    pull_seconds: Optional[float] = None  # the stage's pull, as the workers timed it
    applied: list[str] = field(default_factory=list)  # versions the stage applied to LOCAL
    fallback: Optional[str] = None  # why the pull took a full version, if it did
    deferred: Optional[str] = None  # why the pull was left to the pause
    pause_seconds: Optional[float] = None  # /pause sent to /resume answered
    reload_seconds: Optional[float] = None
    resumed: Optional[bool] = None  # None: never paused
    step: Optional[str] = None  # the step that failed
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EngineUpdateError(Exception):
    """Some engines do not serve the version: ``failed`` maps each one's URL to its step and error;
    ``results`` holds every engine's :class:`EngineResult`, those that succeeded included."""

    def __init__(self, version: str, results: list[EngineResult]) -> None:
        self.version = version
        self.results = results
        self.failed = {r.url: f"{r.step}: {r.error}" for r in results if not r.ok}
        lines = "; ".join(f"{url}: {why}" for url, why in self.failed.items())
        super().__init__(f"version {version} is not served by {len(self.failed)} of {len(results)} engine(s): "
                         f"{lines}")


class _Failed(Exception):
    def __init__(self, step: str, error: str) -> None:
        super().__init__(error)
        self.step = step


class Engines:
    """vLLM engines that serve with the hfdelta backend, and the root they pull from.

    ``urls``: each engine's HTTP address (``http://host:8000``). ``root``: the publication root as the
    engines' hosts see it (the trainer may mount it elsewhere). ``local``: LOCAL on the engines' hosts,
    where they do not serve it themselves (default: the directory each engine serves). Seconds:
    ``timeout`` for each short request, ``pause_timeout`` for ``/pause`` to let running requests finish
    (``pause_mode="wait"``; ``"abort"`` ends them, ``"keep"`` freezes them), ``update_timeout`` for the
    reload, ``stage_timeout`` for the pull, ``lock_timeout`` for LOCAL's lock on the engines' hosts.
    ``log(line)``, if given, is told each step.
    """

    def __init__(self, urls: Sequence[str], *, root: PathLike, local: Optional[PathLike] = None,
                 timeout: float = 30.0, pause_timeout: float = 300.0, update_timeout: float = 600.0,
                 stage_timeout: float = 3600.0, lock_timeout: Optional[float] = 300.0, pause_mode: str = "wait",
                 log: Optional[Callable[[str], object]] = None) -> None:
        if isinstance(urls, str):
            urls = [urls]
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("Engines: no engine URL given")
        for u in self.urls:
            if urllib.parse.urlsplit(u).scheme not in ("http", "https"):
                raise ValueError(f"Engines: {u!r} is not an http:// or https:// URL")
        if pause_mode not in ("wait", "abort", "keep"):
            raise ValueError(f"Engines: pause_mode must be wait, abort or keep, not {pause_mode!r}")
        self.root = _path(root, "root")
        self.local = None if local is None else _path(local, "local")
        self.timeout, self.pause_timeout, self.update_timeout = timeout, pause_timeout, update_timeout
        self.stage_timeout, self.lock_timeout, self.pause_mode = stage_timeout, lock_timeout, pause_mode
        self._log = log

    # ---- HTTP ----

    def _request(self, url: str, method: str, path: str, body: Optional[dict[str, Any]] = None,
                 timeout: Optional[float] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                text = resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            raise EngineRequestError(f"{method} {path}: HTTP {e.code}: {_error_text(e.read())}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EngineRequestError(f"{method} {path}: no answer ({reason})") from None
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def _rpc(self, url: str, method: str, kwargs: dict[str, str], timeout: Optional[float] = None) -> list[Any]:
        """A worker extension method on every worker (POST /collective_rpc): their answers."""
        out = self._request(url, "POST", "/collective_rpc", {"method": method, "kwargs": kwargs}, timeout)
        if not isinstance(out, dict) or not isinstance(out.get("results"), list):
            raise EngineRequestError(f"POST /collective_rpc {method}: unexpected answer {str(out)[:200]}")
        results: list[Any] = out["results"]
        return results

    def _say(self, url: str, msg: str) -> None:
        if self._log is not None:
            self._log(f"{url}: {msg}")

    # ---- the steps ----

    def weight_info(self, url: str) -> Optional[str]:
        """The version an engine reports serving (``/weight_info``), None if it has none."""
        out = self._request(url, "GET", "/weight_info")
        v = out.get("weight_version") if isinstance(out, dict) else None
        return None if v is None else str(v)

    def state(self, url: str) -> list[dict[str, Any]]:
        """Every worker's hfdelta state (``hfdelta_state``): LOCAL's version, the staging, the claim, the last
        update's timings, and LOCAL's files the worker maps."""
        return [s for s in self._rpc(url, "hfdelta_state", {}) if isinstance(s, dict)]

    def _check(self, r: EngineResult, v: int) -> bool:
        """True if the engine needs the update."""
        try:
            r.served_before = self.weight_info(r.url)
        except EngineRequestError as e:
            hint = (" (vLLM has the RL routes only with VLLM_SERVER_DEV_MODE=1 in its environment)"
                    if e.status == 404 else "")
            raise _Failed("weight_info", str(e) + hint) from None
        if r.served_before == r.version:
            r.skipped = r.ok = True
            r.served_after = r.served_before
            self._say(r.url, f"serves version {r.version} already")
            return False
        if r.served_before is not None and r.served_before.isdigit() and int(r.served_before) > v:
            raise _Failed("weight_info", f"the engine serves version {r.served_before}, newer than {r.version}; an "
                                         "engine never goes back to an older version (publish a newer one)")
        return True

    def _stage(self, r: EngineResult, v: int, owner: str) -> None:
        init: dict[str, Any] = {"root": self.root, "lock_timeout": self.lock_timeout}
        if self.local is not None:
            init["local"] = self.local
        t0 = time.monotonic()
        step = "init_weight_transfer_engine"
        try:
            self._request(r.url, "POST", "/init_weight_transfer_engine", {"init_info": init})
            step = "stage"
            states = self._rpc(r.url, "hfdelta_stage", {"version": str(v), "owner": owner})
            delay = 0.05
            while True:
                stages = [s.get("stage") or {} for s in states if isinstance(s, dict)]
                if not stages:
                    raise _Failed(step, f"the engine's workers answered no hfdelta state ({str(states)[:200]})")
                failed = [s for s in stages if s.get("state") == "failed"]
                if failed:
                    raise _Failed(step, str(failed[0].get("error")))
                if any(s.get("version") != r.version for s in stages):
                    raise _Failed(step, f"a worker stages version {stages[0].get('version')}, not {r.version}")
                if all(s.get("state") in ("done", "deferred") for s in stages):
                    break
                if time.monotonic() - t0 > self.stage_timeout:
                    raise _Failed(step, f"the pull of version {r.version} is not over after {self.stage_timeout:g} s")
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
                states = self._rpc(r.url, "hfdelta_state", {"owner": owner})
        except EngineRequestError as e:
            raise _Failed(step, str(e)) from None
        r.stage_seconds = round(time.monotonic() - t0, 6)
        r.pull_seconds = max((s.get("pull_seconds") or 0.0) for s in stages)
        r.applied = sorted({a for s in stages for a in (s.get("applied") or [])})
        r.fallback = next((s["fallback"] for s in stages if s.get("fallback")), None)
        r.deferred = next((s["deferred"] for s in stages if s.get("deferred")), None)
        self._say(r.url, f"staged version {r.version} in {r.stage_seconds:.3f} s"
                  + (f" (applied {', '.join(r.applied)})" if r.applied else " (LOCAL had it)")
                  + (f"; pull deferred to the pause: {r.deferred}" if r.deferred else ""))

    def _swap(self, r: EngineResult, v: int, owner: str) -> None:
        """Pause, update, finish, reset, resume: /resume always, once /pause was sent."""
        step = "pause"
        t0 = time.monotonic()
        failure: Optional[_Failed] = None
        try:
            self._request(r.url, "POST", f"/pause?mode={self.pause_mode}", timeout=self.pause_timeout)
            step = "start_weight_update"
            self._request(r.url, "POST", "/start_weight_update")
            step = "update_weights"
            self._request(r.url, "POST", "/update_weights",
                          {"update_info": {"version": v, "owner": owner}}, timeout=self.update_timeout)
            step = "finish_weight_update"
            self._request(r.url, "POST", "/finish_weight_update", {"weight_version": r.version})
            step = "reset_prefix_cache"
            for _ in range(50):  # false while blocks are still held; paused with mode=wait, none should be
                out = self._request(r.url, "POST", "/reset_prefix_cache")
                if isinstance(out, dict) and out.get("success") is True:
                    break
                time.sleep(0.1)
            else:
                raise _Failed(step, "the prefix cache was not reset after 50 tries (success false): requests may "
                                    "reuse KV blocks computed with the old weights")
        except EngineRequestError as e:
            failure = _Failed(step, str(e))
        except _Failed as e:
            failure = e
        try:
            self._request(r.url, "POST", "/resume")
            r.resumed = True
        except EngineRequestError as e:
            r.resumed = False
            if failure is None:
                failure = _Failed("resume", f"{e}; the engine may still be paused")
            else:
                failure = _Failed(failure.step, f"{failure}; then /resume failed too ({e}): the engine may still be "
                                                "paused")
        r.pause_seconds = round(time.monotonic() - t0, 6)
        self._say(r.url, f"paused for {r.pause_seconds:.3f} s" + (f", {failure.step} failed" if failure else ""))
        if failure is not None:
            raise failure
        try:
            r.served_after = self.weight_info(r.url)
            states = self.state(r.url)
        except EngineRequestError as e:
            raise _Failed("weight_info", str(e)) from None
        reloads = [(s.get("last_update") or {}).get("reload_seconds") for s in states]
        r.reload_seconds = max((x for x in reloads if x is not None), default=None)
        if r.served_after != r.version:
            raise _Failed("weight_info", f"after the update the engine reports version {r.served_after}, not "
                                         f"{r.version}")

    def _release(self, r: EngineResult, owner: str) -> None:
        try:
            self._rpc(r.url, "hfdelta_release", {"owner": owner})
        except EngineRequestError as e:
            self._say(r.url, f"releasing the claim failed ({e}); it ends by itself after 10 minutes unused")

    # ---- the whole ----

    def update(self, version: Version, *, rolling: bool = False) -> list[EngineResult]:
        """Brings every engine to ``version``: stages it on all, then pauses, updates and resumes them, all at
        once or (``rolling``) one after another. Returns the engines' results, in the order of ``urls``, once
        every engine serves the version; raises EngineUpdateError, with every result, if any does not."""
        v = version_number(version)
        name = version_name(v)
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        results = [EngineResult(url=u, version=name) for u in self.urls]
        claimed: set[str] = set()
        mu = threading.Lock()

        def fail(r: EngineResult, e: _Failed) -> None:
            r.ok, r.step, r.error = False, e.step, str(e)
            self._say(r.url, f"{e.step} failed: {e}")

        def prepare(r: EngineResult) -> bool:
            try:
                if not self._check(r, v):
                    return False
                with mu:
                    claimed.add(r.url)
                self._stage(r, v, owner)
                return True
            except _Failed as e:
                fail(r, e)
                return False

        def swap(r: EngineResult) -> None:
            try:
                self._swap(r, v, owner)
                r.ok = True
            except _Failed as e:
                fail(r, e)

        with ThreadPoolExecutor(max_workers=len(results)) as pool:
            try:
                ready = [r for r, go in zip(results, pool.map(prepare, results)) if go]
                if rolling:
                    for r in ready:
                        swap(r)
                else:
                    list(pool.map(swap, ready))
            finally:
                list(pool.map(lambda r: self._release(r, owner), [r for r in results if r.url in claimed]))
        if not all(r.ok for r in results):
            raise EngineUpdateError(name, results)
        return results


def _error_text(body: bytes) -> str:
    """The message of an error answer: vLLM's {"error": {"message": ...}}, {"error": "..."}, {"detail": ...}."""
    text = body.decode(errors="replace")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:2000]
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return str(err)[:2000]
    return text[:2000]
