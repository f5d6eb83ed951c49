"""Fencing, the worker's side: a worker that has heard nothing from its driver for longer than a
bound stops itself, and every process it started, before it can write anything more.

A driver holds a call in flight to each of its workers at all times (the Ray engine's ``drain``,
answered within a second when there is nothing to send, then sent again), served on a thread of
its own beside the training call: a worker busy in user code still hears its driver. When the
calls stop (the driver's host cut off, the driver frozen, or the worker's own host cut off, so
that the driver gave the worker up), nothing else would stop the worker: Ray ends a lost
driver's actors only once its GCS declares the driver's node dead (about a minute with the
default health checks), and a cut host's actors run until the link comes back. A worker that
lives on after its driver gave it up may write into the run (a checkpoint part, the user's own
files) while another attempt, or another driver, owns it.

:class:`Fence` notes every call of the driver (``heard``); its watchdog thread stops the process
once none came for ``bound_s``: the floor (``PHALANX_FENCE_S``, 5 s: the driver's own bound for a
silent host, 3 s, plus the 1 s a ``drain`` may be held and a second of slack), raised to
``GAP_FACTOR`` times the longest gap between the driver's calls seen lately (a loaded driver
calls late, and must not fence its healthy workers), up to ``MAX_FACTOR`` times the floor; time
during which the worker's own process did not run (its watchdog woke over ``STARVED_S`` late:
an overloaded machine) is not counted. It is armed by the first call: a worker that was never
drained (starting up) is left alone.

:func:`stop_process` is how the process stops, so that no user code runs after the decision: the
switch interval is raised so that the watchdog keeps the interpreter, the process's descendants
are frozen (``SIGSTOP``: nothing in the process sees them change), listed again until no new
one appears, then killed (``SIGKILL``) and the process leaves with ``os._exit`` in the same run
of bytecode: no other thread gets the interpreter in between, so no ``except`` or ``finally``
of the training function runs, whatever its children's deaths would have made it do.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

FENCE_EXIT_CODE = 75  # EX_TEMPFAIL: the worker stopped itself; another attempt may run it again
GAP_FACTOR = 3.0  # the bound is at least this many times the longest recent gap between calls
MAX_FACTOR = 4.0  # ... and at most this many times the floor
GAPS_KEPT = 64  # the recent gaps: about a minute of an idle worker's drains
CHECK_S = 0.1  # how often the watchdog looks
# The watchdog woke this much later than asked: this process itself did not run (a machine
# overloaded, a stopped process), and neither could the driver's calls be served: that time is
# not counted as the driver's silence
STARVED_S = 1.0
FREEZE_ROUNDS = 5  # listings of the descendants until none is new (a process may fork meanwhile)


class Fence:
    """The watchdog of one worker; see the module docstring. ``floor_s <= 0``: never fences.

    ``stop(why)`` is called once, from the watchdog's thread, when the driver has been silent
    for ``bound_s``; it is not expected to return (:func:`stop_process`).
    """

    def __init__(
        self,
        floor_s: float,
        stop: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.floor_s = floor_s
        self._stop = stop
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._starved = 0.0  # seconds since the last call during which this process did not run
        self._gaps: collections.deque[float] = collections.deque(maxlen=GAPS_KEPT)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.floor_s > 0

    def heard(self) -> None:
        """A call of the driver arrived; the first one arms the watchdog."""
        if not self.enabled or self._closed.is_set():
            return
        now = self._clock()
        with self._lock:
            if self._last is not None:
                self._gaps.append(now - self._last)
            self._last = now
            self._starved = 0.0
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="phalanx-fence", daemon=True
                )
                self._thread.start()

    def bound_s(self) -> float:
        """How long the driver may be silent before this worker stops (see the module docstring)."""
        with self._lock:
            longest = max(self._gaps, default=0.0)
        return max(self.floor_s, min(GAP_FACTOR * longest, MAX_FACTOR * self.floor_s))

    def silent_s(self) -> float:
        """Seconds since the driver's last call (0 before the first)."""
        with self._lock:
            last, starved = self._last, self._starved
        return 0.0 if last is None else self._clock() - last - starved

    def close(self) -> None:
        """The driver ends this worker itself (``stop``): the watchdog stands down."""
        self._closed.set()

    def _watch(self) -> None:
        tick = self._clock()
        while not self._closed.wait(CHECK_S):
            now = self._clock()
            if now - tick > STARVED_S:
                with self._lock:
                    self._starved += now - tick - CHECK_S
            tick = now
            silent, bound = self.silent_s(), self.bound_s()
            if silent > bound and not self._closed.is_set():
                self._stop(
                    f"no call from the driver for {silent:.1f} s (bound {bound:.1f} s): its "
                    "host is cut off or it is gone, and another attempt may own the run"
                )
                return


def stop_process(
    why: str, descendants: Callable[[int], list[int]], exit_code: int = FENCE_EXIT_CODE
) -> None:
    """Kill every descendant of this process and end it, with no user code in between (see the
    module docstring). Never returns."""
    with contextlib.suppress(OSError):  # the worker's own log: why it went (best effort)
        os.write(2, f"\nphalanx: this worker stops itself: {why}\n".encode())
    sys.setswitchinterval(1e6)  # from here on, this thread keeps the interpreter
    me = os.getpid()
    frozen: set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        new = [p for p in descendants(me) if p not in frozen]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
            frozen.add(pid)
    for pid in frozen:  # os.kill keeps the interpreter: nothing runs until os._exit
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(exit_code)
