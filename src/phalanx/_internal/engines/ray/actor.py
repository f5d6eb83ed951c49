"""The worker side of the Ray engine: what runs inside each Ray actor.

The actor is threaded (``max_concurrency``), so it answers the driver while a long training call
runs:

- ``call(seq, payload)`` only queues; one thread runs the calls in ``seq`` order, as the local
  engine's worker loop does, and queues ``("ret", seq, ok, value)`` (``calls.py``, which also
  ends a running call for in-place recovery);
- everything the worker sends (reports, returns, output lines) is pickled into a buffer at once;
  the driver keeps one ``drain(wait_s, confirmed)`` call in flight per actor, which returns as
  soon as messages exist. ``confirmed`` counts the messages the driver has handled: the buffer
  keeps every message until a later drain confirms it (a reply lost on the way, in a network
  blip, is sent again), and ``report()`` returns once its report is confirmed, so a rank whose
  process dies right after ``report()`` (os._exit, SIGKILL, the OOM killer) has lost nothing;
- file descriptors 1 and 2 go to pipes that a thread reads into ``("out", stream, text)``
  messages, whole lines at once and a partial line (a progress bar, a prompt) after a short idle
  time (``output.py``): the driver prints them with the rank prefix and writes the rank's log
  file;
- every call of the driver (the drain above all, always in flight) is noted by a fence
  (``worker/fence.py``): a worker whose driver has been silent past its bound (its host or the
  driver's cut off) kills what it started and exits, before it can write into a run that another
  attempt may own.

This module is the actor (:class:`PhalanxWorker`) and its outbox (:class:`MessageBuffer`).
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
import traceback
from functools import partial
from typing import Any

from phalanx._foundation import env as env_vars
from phalanx._internal.engines.process_tree import (
    become_subreaper,
    descendants,
    kill_descendants,
)
from phalanx._internal.engines.ray.call_runner import CallRunner
from phalanx._internal.engines.ray.output import OutputCapture
from phalanx._internal.worker.fence import Fence, stop_process
from phalanx._internal.worker.runtime import dumps, run_call, set_outbox

# What waits in ``send`` until the driver has it: a report (with or without a checkpoint part)
# is what the run loses if the process dies right after report() returned.
CONFIRMED_KINDS = frozenset({"report"})
# A training call not ended this long after its interrupt waits in C code: abort its collectives
ABORT_AFTER_S = 0.2


class MessageBuffer:
    """The actor's outbox: ``send`` pickles (a snapshot) and appends; ``take`` hands over what
    the driver has not confirmed yet.

    Messages are numbered from 0 in the order sent. ``take(wait_s, confirmed)`` drops the first
    ``confirmed`` (the driver handled them: it sends the next drain only after handling the
    answer to the last) and returns the rest with the number of the first. A report waits in
    ``send`` until it is confirmed (``CONFIRMED_KINDS``), or until the buffer is closed.
    """

    def __init__(self) -> None:
        self._items: list[bytes] = []  # not confirmed yet, numbered from self._base
        self._base = 0
        self._cond = threading.Condition()
        self.closed = False

    def send(self, message: tuple[Any, ...]) -> None:
        data = dumps(message)
        with self._cond:
            self._items.append(data)
            number = self._base + len(self._items)  # confirmed once _base has passed it
            self._cond.notify_all()
            if message[0] in CONFIRMED_KINDS:
                while self._base < number and not self.closed:
                    self._cond.wait()

    def take(self, wait_s: float, confirmed: int = 0) -> tuple[int, list[bytes]]:
        with self._cond:
            if confirmed > self._base:
                del self._items[: confirmed - self._base]
                self._base = confirmed
                self._cond.notify_all()  # reports waiting for their confirmation
            if not self._items and not self.closed:
                self._cond.wait(wait_s)
            return self._base, list(self._items)

    @property
    def sent(self) -> int:
        """How many messages were sent so far."""
        with self._cond:
            return self._base + len(self._items)

    def close(self) -> None:
        with self._cond:
            self._items.append(dumps(("closed",)))
            self.closed = True
            self._cond.notify_all()


def _freeze_what_lives() -> None:
    """Keep the objects alive now (Ray's and phalanx's, the modules a training call imported)
    out of later collections: with torch imported a full collection over them is a long pause of
    CPU, paid at each in-place reset, by every survivor at once. What the next call makes
    is still collected; a program that manages the collector itself is left alone."""
    if gc.isenabled():
        gc.freeze()


class PhalanxWorker:
    """One phalanx worker as a Ray actor (the class is made remote by the engine)."""

    def __init__(
        self, env: dict[str, str], sys_path: list[str], capture_output: bool = True
    ) -> None:
        env_vars.update(env)
        # What the training function starts stays our descendant, even after its parent died or
        # it left for a new session: stop() kills it all before the actor is killed.
        become_subreaper()
        # The driver's import path, after the worker's own: modules the training function
        # imports by name (the user's project) then load as they would in the local engine.
        sys.path.extend(p for p in sys_path if p not in sys.path)
        self._buffer = MessageBuffer()
        set_outbox(self._buffer)
        self._output = OutputCapture(self._buffer) if capture_output else None
        self._calls = CallRunner(self._buffer)
        # Armed by the first drain: from then on the driver's calls never stop while it lives
        self._fence = Fence(env_vars.fence_s(), partial(stop_process, descendants=descendants))
        _freeze_what_lives()

    def hello(self, marker: tuple[Any, str] | None) -> dict[str, Any]:
        """Who and where this worker is, and whether it can see the run's storage."""
        import ray

        gpu_ids = tuple(int(g) for g in ray.get_gpu_ids() if str(g).isdigit())
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpu_ids": gpu_ids,
            "storage_problem": None if marker is None else storage_problem(*marker),
        }

    def call(self, seq: int, payload: bytes) -> None:
        self._calls.submit(seq, payload)

    def drain(self, wait_s: float, confirmed: int = 0) -> tuple[int, list[bytes]]:
        """The messages from number ``base`` on (``base``: the answer's first item), once some
        exist or after ``wait_s``; the driver has handled the first ``confirmed``."""
        self._fence.heard()
        return self._buffer.take(wait_s, confirmed)

    def reset(
        self, timeout_s: float, reset_payload: bytes, abort_payload: bytes | None = None
    ) -> tuple[bool, int, str]:
        """Make this worker reusable by the next attempt (in-place recovery): end its training
        call, kill what the call started, leave the framework's process group
        (``reset_payload``: a pickled function). A call that does not end at once waits in C
        code (a collective whose peer is gone): ``abort_payload`` (a pickled function) aborts
        the process group so it raises. Returns ``(ok, sent, why)``: ``sent`` counts the
        messages sent so far, all of the old attempt's; ``why`` says what failed."""
        deadline = time.monotonic() + timeout_s
        ended = self._calls.end_current(min(ABORT_AFTER_S, timeout_s))
        if not ended and abort_payload is not None:
            ok, value = run_call(abort_payload)
            if not ok:
                return False, 0, f"aborting its process group failed: {value.message}"
        if not ended:
            ended = self._calls.end_current(max(0.0, deadline - time.monotonic()))
        if not ended:
            return False, 0, f"its training call did not end within {timeout_s:g} s"
        kill_descendants(os.getpid())
        gc.collect()  # the ended call's objects (reference cycles too), before the reset frees memory
        _freeze_what_lives()
        ok, value = run_call(reset_payload)
        if not ok:
            return False, 0, f"leaving the process group failed: {value.message}"
        if self._output is not None:
            self._output.flush(timeout_s)
        return True, self._buffer.sent, ""

    def stop(self, flush_timeout_s: float) -> None:
        """Kill every process the training function started, send the output written so far,
        then a last ``("closed",)`` message."""
        self._fence.close()  # the driver stops draining this worker now: not a lost driver
        kill_descendants(os.getpid())
        if self._output is not None:
            self._output.flush(flush_timeout_s)
        self._buffer.close()

    def stacks(self) -> str:
        """Every thread's Python stack, most recent call last."""
        names = {t.ident: t.name for t in threading.enumerate()}
        parts = []
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            stack = "".join(traceback.format_stack(frame))
            parts.append(
                f"Thread {ident:#x} {names.get(ident, '?')} (most recent call last):\n{stack}"
            )
        return "\n".join(parts)

    def preemption_notice(self, notice: dict[str, Any]) -> None:
        from phalanx._internal.worker.session import get_session
        from phalanx.context import PreemptionInfo

        session = get_session()
        if session is not None:
            session.preemption = PreemptionInfo(
                int(notice["stop_round"]),
                tuple(notice["preempted_ranks"]),
                float(notice["deadline"]),
            )


def storage_problem(filesystem: Any, marker: str) -> str | None:
    """Why this worker cannot see the run directory's marker file, or None if it can.

    ``filesystem`` is an fsspec/pyarrow filesystem with ``exists``, or None for a local path.
    """
    try:
        found = os.path.exists(marker) if filesystem is None else filesystem.exists(marker)
    except Exception as exc:
        return f"checking {marker} failed: {type(exc).__name__}: {exc}"
    return None if found else f"{marker} does not exist on this node"
