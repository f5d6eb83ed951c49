"""The worker side of the Ray engine: what runs inside each Ray actor.

The actor is threaded (``max_concurrency``), so it answers the driver while a long training call
runs:

- ``call(seq, payload)`` only queues; one thread runs the calls in ``seq`` order, as the local
  engine's worker loop does, and queues ``("ret", seq, ok, value)``;
- everything the worker sends (reports, returns, output lines) is pickled into a buffer at once;
  the driver keeps one ``drain(wait_s, confirmed)`` call in flight per actor, which returns as
  soon as messages exist. ``confirmed`` counts the messages the driver has handled: the buffer
  keeps every message until a later drain confirms it (a reply lost on the way, in a network
  blip, is sent again), and ``report()`` returns once its report is confirmed, so a rank whose
  process dies right after ``report()`` (os._exit, SIGKILL, the OOM killer) has lost nothing;
- file descriptors 1 and 2 go to pipes that a thread reads into ``("out", stream, text)``
  messages, whole lines at once and a partial line (a progress bar, a prompt) after a short idle
  time: the driver prints them with the rank prefix and writes the rank's log file.
"""

from __future__ import annotations

import ctypes
import gc
import os
import selectors
import socket
import sys
import threading
import time
import traceback
from typing import Any

import cloudpickle

from phalanx._internal import env as env_vars
from phalanx._internal.engines.process_tree import become_subreaper, kill_descendants
from phalanx._internal.worker.runtime import capture_exception, dumps, run_call, set_outbox
from phalanx._internal.worker.session import AttemptInterrupted, get_session

# Lines Ray's log monitor uses to attribute worker output; they mean nothing to the user.
_RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")
_STREAMS = ((1, "stdout"), (2, "stderr"))
IDLE_S = 0.03  # a partial line is sent after this long without more output
# What waits in ``send`` until the driver has it: a report (with or without a checkpoint part)
# is what the run loses if the process dies right after report() returned.
CONFIRMED_KINDS = frozenset({"report"})


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


class OutputCapture:
    """Sends what the process writes to fds 1 and 2 to the driver, a message per chunk of lines."""

    def __init__(self, buffer: MessageBuffer) -> None:
        self._buffer = buffer
        self._selector = selectors.DefaultSelector()
        self._partial = {"stdout": b"", "stderr": b""}
        self._since: dict[str, float] = {}  # stream -> when its partial line began
        for fd, name in _STREAMS:
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            self._selector.register(read_end, selectors.EVENT_READ, name)
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._flushed = threading.Event()
        # Line-buffered, so each line leaves the process as it is printed.
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        self._thread = threading.Thread(target=self._run, name="phalanx-output", daemon=True)
        self._thread.start()

    def flush(self, timeout_s: float) -> None:
        """Send everything written so far, including a last line without a newline."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._flushed.clear()
        os.write(self._wake_w, b"f")
        self._flushed.wait(timeout_s)

    def _run(self) -> None:
        while True:
            # A partial line (a bar, a prompt) goes IDLE_S after its first byte came.
            events = self._selector.select(self._partial_timeout())
            for key, _ in events:
                if key.data is None:
                    os.read(self._wake_r, 64)
                    for fd, stream in self._stream_fds():
                        self._read(fd, stream, final=True)
                    self._send_partial(force=True)
                    self._flushed.set()
                else:
                    self._read(int(key.fd), key.data, final=False)
            self._send_partial(force=False)

    def _partial_timeout(self) -> float | None:
        for stream, data in self._partial.items():
            if not data:
                self._since.pop(stream, None)
            elif stream not in self._since:
                self._since[stream] = time.monotonic()
        if not self._since:
            return None
        return max(0.0, min(self._since.values()) + IDLE_S - time.monotonic())

    def _stream_fds(self) -> list[tuple[int, str]]:
        keys = self._selector.get_map().values()
        return [(int(k.fd), k.data) for k in keys if k.data is not None]

    def _read(self, fd: int, stream: str, final: bool) -> None:
        data = self._partial[stream]
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self._selector.unregister(fd)
                final = True
                break
            data += chunk
            if not final:
                break
        lines = data.split(b"\n")
        self._partial[stream] = lines.pop()
        text = "".join(
            s + "\n" for s in (ln.decode("utf-8", "replace") for ln in lines) if not _is_marker(s)
        )
        if final and self._partial[stream]:
            text += self._partial[stream].decode("utf-8", "replace")
            self._partial[stream] = b""
        if text:
            self._buffer.send(("out", stream, text))

    def _send_partial(self, force: bool) -> None:
        now = time.monotonic()
        for stream, data in self._partial.items():
            since = self._since.get(stream)
            if not data or not (force or (since is not None and now - since >= IDLE_S)):
                continue
            cut = _utf8_boundary(data)  # a character cut in two waits for its other half
            self._partial[stream] = data[cut:]
            self._since[stream] = now  # what is left (half a character) waits its turn again
            if cut:
                self._buffer.send(("out", stream, data[:cut].decode("utf-8", "replace")))


def _utf8_boundary(data: bytes) -> int:
    """The length of ``data`` without a trailing incomplete UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character
            need = (
                1 if byte < 0x80 else 2 if byte >= 0xC0 and byte < 0xE0 else 3 if byte < 0xF0 else 4
            )
            return len(data) if back >= need else len(data) - back
    return len(data)


def _is_marker(line: str) -> bool:
    return line.startswith(_RAY_MARKERS)


class CallRunner:
    """Runs calls one at a time in ``seq`` order (they may arrive out of order on Ray's threads).

    ``end_current`` ends the call that runs (in-place recovery): the session's next ``report()``
    raises, and so does the call's own code at its next Python instruction; a call blocked in C
    (a collective, a sleep) ends only when that returns.
    """

    def __init__(self, buffer: MessageBuffer) -> None:
        self._buffer = buffer
        self._pending: dict[int, bytes] = {}
        self._next = 0
        self._cond = threading.Condition()
        self._running = False  # a call is taken and its answer not sent yet
        self._interruptible = False  # the call's own code runs: an interrupt lands inside it
        self.thread = threading.Thread(target=self._run, name="phalanx-calls", daemon=True)
        self.thread.start()

    def submit(self, seq: int, payload: bytes) -> None:
        with self._cond:
            self._pending[seq] = payload
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next not in self._pending:
                    self._cond.wait()
                seq, payload = self._next, self._pending.pop(self._next)
                self._next += 1
                self._running = True
            ok, value = self._call(payload)
            try:
                self._buffer.send(("ret", seq, ok, value))
            except Exception as exc:  # the return value does not pickle
                self._buffer.send(("ret", seq, False, capture_exception(exc)))
            # An exception holds its traceback's frames, and they the call's objects (a model on
            # the GPU): none of them may outlive the call into the next attempt's.
            value = None
            with self._cond:
                self._running = False
                self._cond.notify_all()

    def _call(self, payload: bytes) -> tuple[bool, Any]:
        """``run_call``, interruptible only while the call's code runs: an interrupt can land
        nowhere but inside this ``try`` (the flag is cleared under the lock the interrupter
        holds, then a pending interrupt is cancelled)."""
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            with self._cond:
                self._interruptible = True
            try:
                value = fn(*args, **kwargs)
            finally:
                self._leave_interruptible()
                _drop_pending_interrupt()
            return True, value
        except BaseException as exc:  # the driver decides what a failure means
            return False, capture_exception(exc)

    def _leave_interruptible(self) -> None:
        while True:
            try:
                with self._cond:
                    self._interruptible = False
                return
            except AttemptInterrupted:  # landed on the way out: the flag is cleared next try
                continue

    def end_current(self, timeout_s: float) -> bool:
        """End the running call; whether this worker is idle (no call runs) within ``timeout_s``."""
        session = get_session()
        if session is not None:
            session.interrupted = True
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._running and time.monotonic() < deadline:
                if self._interruptible:
                    _async_raise(self.thread, AttemptInterrupted)
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self._running and not self._pending


def _freeze_what_lives() -> None:
    """Keep the objects alive now (Ray's and phalanx's, the modules a training call imported)
    out of later collections: a full collection over them costs ~50-110 ms of CPU (torch
    imported), paid at each in-place reset, by every survivor at once. What the next call makes
    is still collected; a program that manages the collector itself is left alone."""
    if gc.isenabled():
        gc.freeze()


class _Dropped(BaseException):
    """Raised in the calling thread by :func:`_drop_pending_interrupt`, and caught there."""


def _drop_pending_interrupt() -> None:
    """Drop an interrupt that did not land, in the calling thread.

    Not by ``PyThreadState_SetAsyncExc(thread, NULL)``: CPython then leaves the interpreter's
    "asynchronous exception pending" signal set with nothing to deliver, and every traced call
    (a debugger, coverage) spins forever at its first line. Delivering an exception of our own
    to this thread replaces the pending one and clears the signal, and it is caught here.
    """
    while True:
        try:
            _async_raise(threading.current_thread(), _Dropped)
            while True:  # delivered at the next check of the eval loop
                pass
        except _Dropped:
            return
        except AttemptInterrupted:  # an interrupt landed before ours was set: set ours again
            continue


def _async_raise(thread: threading.Thread, exc_type: type[BaseException] | None) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (None: cancel that)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type) if exc_type else None
        )


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
        return self._buffer.take(wait_s, confirmed)

    def reset(self, timeout_s: float, reset_payload: bytes) -> tuple[bool, int, str]:
        """Make this worker reusable by the next attempt (in-place recovery): end its training
        call, kill what the call started, leave the framework's process group
        (``reset_payload``: a pickled function). Returns ``(ok, sent, why)``: ``sent`` counts
        the messages sent so far, all of the old attempt's; ``why`` says what failed."""
        if not self._calls.end_current(timeout_s):
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
