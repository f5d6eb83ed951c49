"""Shared fixtures. Every test fails if it leaks child processes, phalanx threads or env vars."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != "zombie"}


def _phalanx_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("phalanx-")}


@pytest.fixture(autouse=True)
def no_leaks():
    env_before = dict(os.environ)
    children_before = _children()
    threads_before = _phalanx_threads()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leaked_children = _children() - children_before
        leaked_threads = _phalanx_threads() - threads_before
        if not leaked_children and not leaked_threads:
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


@pytest.fixture
def storage(tmp_path):
    return str(tmp_path / "runs")
