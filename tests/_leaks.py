"""The leak check every test runs (``no_leaks`` in tests/conftest.py and tests/ray/conftest.py).

A test fails if it leaves behind a child process, a running ``phalanx-*`` thread, a changed
environment variable, or a new entry in ``~/phalanx_results`` (the session's temp HOME, see
``isolated_home`` in tests/conftest.py; with ``PHALANX_TESTS_ALONE=1``, as ``.ci/run`` sets,
the real home's too) or a ``phalanx*`` entry in the temp directory that is not a user's object
by design (``USERS_TEMP_PREFIXES``; also only with ``PHALANX_TESTS_ALONE=1``). The environment is restored before
the asserts, so one leak fails one test and changes nothing for the next. The fork server a
CUDA-initialised driver keeps warm for its next fit() is stopped first, as at the driver's exit. Under Ray, Ray's own processes (GCS, raylet, agents, ``ray::IDLE`` pool
workers, Ray Data's actors) may outlive a test until its fixture shuts Ray down; phalanx's actors
(``ray::PhalanxWorker``) may not.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

PHALANX_ACTOR = "PhalanxWorker"
RAY_DAEMONS = ("raylet", "gcs_server")
# The home directory before the session pointed HOME into a temp dir: a test writing to the real
# ~/phalanx_results (a path computed before the fixture, a subprocess given the old HOME) is caught.
REAL_HOME = os.path.expanduser("~")
# The real home's ~/phalanx_results and the shared temp directory are shared with every other
# process of the machine: their new entries are blamed on the test only where this run is the only
# one (.ci/run says so); a developer's concurrent runs would otherwise fail each other's tests.
CHECK_SHARED_DIRS = os.environ.get("PHALANX_TESTS_ALONE") == "1"
# Temp entries phalanx creates for the user and leaves to them, as Ray does: a checkpoint made in
# memory (Checkpoint.from_model/from_dict, a framework's own checkpoint, Lightning's per-rank
# directory) is the user's object, and its directory lives as long as they keep it.
USERS_TEMP_PREFIXES = (
    "phalanx_torch_checkpoint_",
    "phalanx_tf_checkpoint_",
    "phalanx_xgboost_",
    "phalanx_lightgbm_",
    "phalanx_sklearn_",
    "phalanx-lightning-",
    # Not the user's: the local engine's notice directory lives as long as the warm engine (one
    # per driver process, reused by every fit()) and goes with it (LocalEngine.close at exit).
    "phalanx-notice-",
)


def any_child(name: str) -> bool:
    return True


def ray_tolerant(name: str) -> bool:
    """Ray's processes end with ray.shutdown(); phalanx's actors must end with fit()."""
    if PHALANX_ACTOR in name:
        return True
    return not name.startswith(("ray::", "ray-daemon ")) and name not in RAY_DAEMONS


def children() -> dict[int, str]:
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = _label(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def _label(proc: psutil.Process) -> str:
    """The process title; Ray's Python daemons (log monitor, agents) are named by their script."""
    name = proc.name()
    if name.startswith("python"):
        script = next((a for a in proc.cmdline()[1:] if not a.startswith("-")), "")
        if f"{os.sep}ray{os.sep}" in script:
            return f"ray-daemon {os.path.basename(script)}"
    return name


def phalanx_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("phalanx-")}


def results_entries() -> set[str]:
    """What the default storage path holds, in the real home and the current one."""
    found = set()
    homes = {REAL_HOME, os.path.expanduser("~")} if CHECK_SHARED_DIRS else {os.path.expanduser("~")}
    for home in homes:
        results = os.path.join(home, "phalanx_results")
        if os.path.isdir(results):
            found.update(os.path.join(results, name) for name in os.listdir(results))
    return found


def temp_entries() -> set[str]:
    """The temp directory's ``phalanx*`` entries that are not a user's object by design."""
    if not CHECK_SHARED_DIRS:
        return set()
    root = tempfile.gettempdir()
    return {
        path
        for path in glob.glob(os.path.join(root, "phalanx*"))
        if not os.path.basename(path).startswith(USERS_TEMP_PREFIXES)
    }


def wait_until_settled(timeout_s: float = 30.0, quiet_s: float = 1.0) -> None:
    """Wait until Ray has started what it starts in the background (agents, idle workers)."""
    deadline = time.monotonic() + timeout_s
    last, since = children(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = children()
        if now != last:
            last, since = now, time.monotonic()


@contextmanager
def no_leaks(is_leak: Callable[[str], bool] = any_child) -> Iterator[None]:
    """Fail if the body leaves a child process (that ``is_leak``), a thread or an env var."""
    env_before = dict(os.environ)
    children_before = children()
    threads_before = phalanx_threads()
    files_before = results_entries() | temp_entries()
    try:
        yield
    finally:  # first put the environment back: a leak fails this test, never the next ones
        changed = {
            k
            for k in set(env_before) | set(os.environ)
            if env_before.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST"
        }
        os.environ.clear()
        os.environ.update(env_before)
    warm = sys.modules.get("phalanx._internal.engines.local.warm_server")
    if warm is not None:  # the fork server kept for the next fit() ends with the test
        warm.shut_down()
    deadline = time.monotonic() + 5
    while True:
        leaked_children = {
            pid: name
            for pid, name in children().items()
            if pid not in children_before and is_leak(name)
        }
        leaked_threads = phalanx_threads() - threads_before
        if (not leaked_children and not leaked_threads) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked_children, f"test left child processes behind: {leaked_children}"
    assert not leaked_threads, f"test left phalanx threads running: {leaked_threads}"
    assert not changed, f"test changed environment variables: {sorted(changed)}"
    written = (results_entries() | temp_entries()) - files_before
    assert not written, (
        f"test wrote outside its temp directory: {sorted(written)}\n"
        "HINT: pass storage_path=tmp_path (RunConfig) and keep temp files under tmp_path."
    )
