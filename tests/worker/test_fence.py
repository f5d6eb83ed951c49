"""Fencing, the worker's side: a worker whose driver has gone silent stops itself and every process
it started within its bound, and no user code runs after the decision (not even the ``except``
of a call that was waiting on a child the fence killed); a worker whose driver keeps calling is
never stopped, however long its user code is busy. Real processes; the bound is made small."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx._internal.worker.fence import FENCE_EXIT_CODE, GAP_FACTOR, MAX_FACTOR, Fence
from tests._helpers.waiting import wait_until

BOUND_S = 0.5

# The worker: a fence with a small bound, a child and a grandchild left in a new session (an
# orphan re-parented to this subreaper), then "user code" waiting on its child, with an
# except and a finally that would write into the run if they ever ran.
WORKER = """
import os, subprocess, sys, threading, time
from phalanx._internal.engines.process_tree import become_subreaper, descendants
from phalanx._internal.worker.fence import Fence, stop_process

marks, beat, bound = sys.argv[1], sys.argv[2] == "beat", float(sys.argv[3])
become_subreaper()
fence = Fence(bound, lambda why: stop_process(why, descendants))
fence.heard()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
subprocess.run(
    [sys.executable, "-c",
     "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
     "'import time; time.sleep(60)'], start_new_session=True)"],
    check=True,
)
if beat:  # the driver's drains, on their own thread
    def beats():
        while True:
            fence.heard()
            time.sleep(0.05)
    threading.Thread(target=beats, daemon=True).start()
with open(os.path.join(marks, "pids.tmp"), "w") as f:
    f.write(" ".join(str(p) for p in descendants(os.getpid())))
os.rename(os.path.join(marks, "pids.tmp"), os.path.join(marks, "pids"))
try:
    if beat:  # busy in user code for 4 bounds: sleeping, then computing
        time.sleep(2 * bound)
        end = time.monotonic() + 2 * bound
        while time.monotonic() < end:
            sum(range(10000))
        open(os.path.join(marks, "finished"), "w").close()
    else:
        child.wait()  # the fence kills the child: this returns, and nothing may follow
        open(os.path.join(marks, "after"), "w").close()
except BaseException:
    open(os.path.join(marks, "except"), "w").close()
    raise
finally:
    open(os.path.join(marks, "finally"), "w").close()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    script, marks = tmp_path / "worker.py", tmp_path / "marks"
    script.write_text(WORKER)
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(tmp_path / "stderr", "wb") as stderr:
        worker = subprocess.Popen(
            [sys.executable, str(script), str(marks), mode, str(BOUND_S)],
            env=env,
            stderr=stderr,
        )
    wait_until(lambda: (marks / "pids").exists() or worker.poll() is not None, timeout_s=60)
    return worker, marks


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs Linux: /proc, subreapers")
def test_a_worker_whose_driver_is_silent_stops_with_its_children_and_runs_no_more_code(
    tmp_path: Path,
) -> None:
    worker, marks = _start(tmp_path, "silent")
    pids = [int(p) for p in (marks / "pids").read_text().split()]
    assert len(pids) == 2, pids  # the child and the orphaned grandchild
    began = time.monotonic()
    try:
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    took = time.monotonic() - began
    stderr = (tmp_path / "stderr").read_text()
    assert code == FENCE_EXIT_CODE, stderr
    assert "this worker stops itself: no call from the driver" in stderr
    assert took < BOUND_S + 2.0, took  # the bound, plus the watchdog's tick and slack
    wait_until(lambda: not any(_alive(p) for p in pids), timeout_s=5)
    assert sorted(p.name for p in marks.iterdir()) == ["pids"]  # no except, finally, after


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs Linux: /proc, subreapers")
def test_a_worker_busy_in_user_code_is_not_stopped_while_its_driver_calls(
    tmp_path: Path,
) -> None:
    worker, marks = _start(tmp_path, "beat")
    pids = [int(p) for p in (marks / "pids").read_text().split()]
    try:
        code = worker.wait(timeout=30)
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)
    assert code == 0, (tmp_path / "stderr").read_text()
    assert (marks / "finished").exists() and not (marks / "except").exists()


def test_the_bound_grows_with_the_drivers_slowest_calls_within_limits() -> None:
    now = [0.0]
    fence = Fence(5.0, lambda why: None, clock=lambda: now[0])
    assert fence.bound_s() == 5.0 and fence.silent_s() == 0.0  # not armed: never silent
    try:
        for gap in (0.0, 1.0, 1.0, 2.5, 1.0):  # the driver's drains, one answered late
            now[0] += gap
            fence.heard()
        assert fence.bound_s() == GAP_FACTOR * 2.5  # a loaded driver: 7.5 s, not 5
        now[0] += 100.0  # one huge pause: the bound is capped
        fence.heard()
        assert fence.bound_s() == MAX_FACTOR * 5.0
    finally:
        fence.close()
    assert Fence(0.0, lambda why: None).enabled is False


def test_time_the_worker_itself_did_not_run_is_not_counted_as_the_drivers_silence() -> None:
    now = [0.0]
    stops: list[str] = []
    fence = Fence(5.0, stops.append, clock=lambda: now[0])
    fence.heard()
    try:
        now[0] += 30.0  # the whole process stopped (SIGSTOP, an overloaded machine): no tick ran
        wait_until(lambda: fence.silent_s() < 1.0, timeout_s=5)  # the watchdog saw it was late
        assert stops == []
        while not stops:  # then the driver stays silent, the process running: fenced
            assert now[0] < 60, fence.silent_s()
            now[0] += 0.05
            time.sleep(0.01)  # a watchdog tick now and then (each sees 0.05 s pass)
        assert 5.0 < fence.silent_s() < 6.0 and "no call from the driver" in stops[0]
    finally:
        fence.close()
