"""Waiting for something to happen, never sleeping for a guessed time: a loaded 2-core machine
can be slower than any guess, and a fast one wastes the whole guess."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "condition") -> T:
    """Poll ``condition`` until it returns a true value and return that value; fail the test
    with ``what`` when ``timeout_s`` passes first.

    Example::

        pid = wait_until(lambda: read_pid(path), 10, "the worker's pid file")
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(pause)  # a poll interval, growing to 50 ms: not a guess at when it happens
        pause = min(pause * 2, 0.05)


def wait_for_file(path: str | os.PathLike[str], timeout_s: float = 30.0) -> None:
    """Wait until ``path`` exists (a marker file another process writes)."""
    wait_until(lambda: os.path.exists(path), timeout_s, f"{os.fspath(path)} to appear")
