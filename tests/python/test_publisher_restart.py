"""Restart safety of hfdelta.Publisher: a trainer's publishing loop
(publish_child.py) killed with SIGKILL at random instants, and at write steps
chosen with the library's fault injection (HFDELTA_FAULT_AT: the N-th write
step kills the process, whichever thread makes it: publishing or the mirror's
advance in the background). After each kill the loop is started again, and
root and mirror must converge: every version published is byte for byte the
delta delta-diff writes between the saves, the mirror equals the last save and
verifies clean, and a fresh host pulling the root gets the last save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from conftest import files_of

import hfdelta

CHILD = Path(__file__).with_name("publish_child.py")



@pytest.fixture(scope="module")
def reference(tools: Any, series: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT as delta-diff publishes saves 0..4: the versions the publisher must write."""
    ref = tmp_path_factory.mktemp("ref")
    for v in range(1, 5):
        r = tools.run("diff", "-q", "--no-sync", "--encoding", "sparse", series[v - 1], series[v], ref)
        assert r.code == 0, r.err
    return ref


def start(root: Path, mirror: Path, series: list[Path], last: int, fault_at: Optional[int] = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("HFDELTA_FAULT_AT", None)
    if fault_at is not None:
        env.update(HFDELTA_FAULT_AT=str(fault_at), HFDELTA_FAULT_MODE="kill")
    return subprocess.Popen([sys.executable, str(CHILD), str(root), str(mirror), str(series[0].parent), str(last),
                             "sparse"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(root: Path, mirror: Path, series: list[Path], last: int) -> dict[str, Any]:
    """Runs the loop to its end, undisturbed; its opening."""
    p = start(root, mirror, series, last)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"the restarted publisher failed (exit {p.returncode}):\n{err}"
    opening: dict[str, Any] = json.loads(out.splitlines()[0])
    return opening


def check_converged(tools: Any, root: Path, mirror: Path, reference: Path, series: list[Path], last: int,
                    tmp: Path) -> None:
    published = sorted(n for n in os.listdir(root) if n.startswith("weight_v"))
    assert published == [f"weight_v{v:06d}" for v in range(1, last + 1)]
    for name in published:
        assert files_of(root / name) == files_of(reference / name), f"{name} is not delta-diff's"
    assert files_of(mirror) == files_of(series[last]), "the mirror is not the last save"
    st = hfdelta.status(mirror)
    assert st.state == "clean" and st.version == f"{last:06d}"
    assert hfdelta.verify(mirror).state == "clean"
    host = tmp / "host"
    shutil.rmtree(host, ignore_errors=True)
    hfdelta.init(series[0], host, sync=False)
    hfdelta.pull(root, host, sync=False)
    assert files_of(host) == files_of(series[last]), "a host pulling the root does not get the last save"


def fresh(tmp: Path, series: list[Path]) -> tuple[Path, Path]:
    shutil.rmtree(tmp / "root", ignore_errors=True)
    shutil.rmtree(tmp / "mirror", ignore_errors=True)
    (tmp / "root").mkdir()
    hfdelta.init(series[0], tmp / "mirror", sync=False)
    return tmp / "root", tmp / "mirror"


def test_killed_at_write_steps(tools: Any, series: list[Path], reference: Path, tmp_path: Path) -> None:
    """Killed at write step N of publishing two versions, for N across every step (each step up to 40, then
    every 5th); restarted, the loop completes and everything converges."""
    last, n, killed, caught_up, rolled_back = 2, 1, 0, 0, 0
    while True:
        root, mirror = fresh(tmp_path, series)
        p = start(root, mirror, series, last, fault_at=n)
        _, err = p.communicate(timeout=300)
        if p.returncode == 0:
            break  # N is past the last write step: the sweep is done
        assert p.returncode == -signal.SIGKILL, f"step {n}: exit {p.returncode}:\n{err}"
        killed += 1
        opening = finish(root, mirror, series, last)
        caught_up += bool(opening["caught_up"])
        rolled_back += opening["rolled_back"] is not None
        check_converged(tools, root, mirror, reference, series, last, tmp_path)
        n += 1 if n < 40 else 5
    print(f"killed at {killed} write steps of {n - 1}; restarts caught the mirror up {caught_up} times, "
          f"rolled back an interrupted advance {rolled_back} times")
    assert killed >= 20
    assert caught_up > 0 and rolled_back > 0, "the sweep missed the kills between publishing and advancing"


def test_killed_at_random_instants(tools: Any, series: list[Path], reference: Path, tmp_path: Path) -> None:
    """The loop publishing four versions, killed twelve times at random instants after it opened (uniform over
    the time an undisturbed run takes to publish them), then let finish."""
    last = 4
    root, mirror = fresh(tmp_path, series)
    p = start(root, mirror, series, last)
    assert p.stdout is not None and p.stdout.readline()  # opened
    t0 = time.monotonic()
    p.communicate(timeout=300)
    took = time.monotonic() - t0  # an undisturbed run's publishing, after it opened
    assert p.returncode == 0
    rng = random.Random(int(os.environ.get("HFDELTA_TEST_SEED", "1")))
    mid = 0
    for _ in range(12):
        root, mirror = fresh(tmp_path, series) if mid == 0 else (root, mirror)
        p = start(root, mirror, series, last)
        assert p.stdout is not None
        if not p.stdout.readline():  # it died opening (never: a kill comes after this line)
            pytest.fail(f"the publisher failed to open: {p.communicate()[1]}")
        time.sleep(rng.uniform(0, took))
        p.kill()
        out, _ = p.communicate(timeout=60)
        if f"published {last:06d}" not in out:
            mid += 1  # killed before the last version was out: a restart has work left
    print(f"{mid} of 12 kills landed while versions were still being published (undisturbed: {took:.2f} s)")
    assert mid >= 6
    finish(root, mirror, series, last)
    check_converged(tools, root, mirror, reference, series, last, tmp_path)
