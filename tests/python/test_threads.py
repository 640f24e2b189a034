"""The GIL is released while the library works, and progress reaches a callback."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import hfdelta


def test_gil_released_during_diff(big_pair: tuple[Path, Path], tmp_path: Path) -> None:
    # Another thread keeps stamping the time; while diff runs in this one, it
    # can only while the diff has let go of the GIL. Held throughout, its
    # stamps would leave a gap as long as the diff.
    stamps: list[float] = []
    running = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        running.set()
        while not stop.is_set():
            stamps.append(time.monotonic())
            for _ in range(100):
                pass

    t = threading.Thread(target=spin)
    t.start()
    running.wait()
    try:
        t0 = time.monotonic()
        r = hfdelta.diff(big_pair[0], big_pair[1], tmp_path / "d", delta_version=1, encoding="auto", level=9,
                         threads=1, sync=False)
        t1 = time.monotonic()
    finally:
        stop.set()
        t.join()
    assert r.tensors_changed > 0
    took = t1 - t0
    assert took > 0.1, f"the diff took {took:.3f} s, too short to tell"
    during = [s for s in stamps if t0 <= s <= t1]
    points = [t0, *during, t1]
    gap = max(b - a for a, b in zip(points, points[1:]))
    assert len(during) > 100 and gap < took / 2, (
        f"the other thread stamped {len(during)} times in {took:.3f} s, largest gap {gap:.3f} s: the GIL was held")


def test_progress_callback(big_pair: tuple[Path, Path], tmp_path: Path) -> None:
    calls: list[tuple[str, int, int]] = []
    main = threading.get_ident()
    threads: set[int] = set()

    def progress(phase: str, done: int, total: int) -> None:
        threads.add(threading.get_ident())
        calls.append((phase, done, total))

    r = hfdelta.diff(big_pair[0], big_pair[1], tmp_path / "d", delta_version=1, threads=1, sync=False,
                     progress=progress)
    assert r.ok
    assert calls, "the progress callback was never called"
    assert main not in threads  # from the helper thread
    phases = {p for p, _, _ in calls}
    for phase in phases:
        done = [d for p, d, _ in calls if p == phase]
        assert done == sorted(done), f"{phase}: done went back: {done}"
    assert all(0 <= d <= t for _, d, t in calls if t)
    assert calls[-1][1] == calls[-1][2]  # the last call: where the call ended


def test_progress_callback_that_raises(series: list[Path], tmp_path: Path) -> None:
    raised: list[BaseException] = []
    calls = 0

    def progress(phase: str, done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad callback")

    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: raised.append(u.exc_value) if u.exc_value is not None else None
    try:
        r = hfdelta.init(series[0], tmp_path / "local", progress=progress)
    finally:
        sys.unraisablehook = hook
    assert r.ok  # the operation went on
    assert calls <= 1 and len(raised) == calls
    assert all(isinstance(e, ValueError) for e in raised)


def test_calls_from_threads(series: list[Path], published: Path, tmp_path: Path) -> None:
    # Several LOCALs pulled at once from Python threads.
    locals_ = [tmp_path / f"l{i}" for i in range(3)]
    for l in locals_:
        hfdelta.init(series[0], l)
    out: dict[int, str | None] = {}

    def pull(i: int) -> None:
        out[i] = hfdelta.pull(published, locals_[i]).to_version

    ts = [threading.Thread(target=pull, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {0: "000004", 1: "000004", 2: "000004"}
