"""The leak check every test runs (``no_leaks`` in tests/conftest.py and tests/ray/conftest.py).

A test fails if it leaves behind a child process, a running ``phalanx-*`` thread or a changed
environment variable. Under Ray, Ray's own processes (GCS, raylet, agents, ``ray::IDLE`` pool
workers, Ray Data's actors) may outlive a test until its fixture shuts Ray down; phalanx's actors
(``ray::PhalanxWorker``) may not.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

PHALANX_ACTOR = "PhalanxWorker"
RAY_DAEMONS = ("raylet", "gcs_server")


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
    yield
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
    changed = {
        k
        for k in set(env_before) | set(os.environ)
        if env_before.get(k) != os.environ.get(k) and k != "PYTEST_CURRENT_TEST"
    }
    os.environ.clear()
    os.environ.update(env_before)
    assert not changed, f"test changed environment variables: {sorted(changed)}"
