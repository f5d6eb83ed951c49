"""The main loop of a worker process (local engine): receive calls, run them, send results.

Calls run in the main thread, so the user's training function gets the main thread (signal
handlers, libraries that insist on it). ``report()`` pickles and hands the bytes to the kernel
without waiting for the driver; a sender thread writes what the socket cannot take at once.

A control thread reads the driver's socket while a call runs, so the driver can *reset* the
worker for in-place recovery (a failed attempt's survivor serves the next attempt): the running
call is ended (the session's next ``report()`` raises :class:`AttemptInterrupted`, and so does
the call's own Python code at once); a call that does not end within ``ABORT_AFTER_S`` waits in
C code, typically a collective whose peer died, and the backend's abort function (the process
group aborted) makes it raise. Then what the call started is killed and the backend's reset
function leaves the framework's process group; the answer is the reset message's return.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
from multiprocessing.connection import Connection
from queue import SimpleQueue
from typing import Any

from phalanx._foundation import env
from phalanx._internal.engines.interruptible import InterruptibleCalls
from phalanx._internal.engines.process_tree import kill_descendants
from phalanx._internal.worker.runtime import capture_exception, dumps, run_call, set_outbox

# A training call not ended this long after its interrupt waits in C code: abort its collectives
ABORT_AFTER_S = 0.2


class ProcessOutbox:
    """Pickles in the caller's thread (a snapshot of the metrics) and hands the bytes to the
    kernel before ``send`` returns, without ever waiting for the driver.

    A message goes straight into the socket with a non-blocking send when nothing is queued
    before it, so a report survives a SIGKILL right after ``report()`` returns (a lost machine,
    an OOM kill). What the socket buffer cannot take at once (a large message, a driver that
    reads slowly) is queued, in order, for the sender thread, which writes it blocking.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        # The same socket as ``conn`` (the driver reads it with Connection.recv_bytes), as a
        # socket object for send(MSG_DONTWAIT).
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._queue: SimpleQueue[bytes | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._backlog = 0  # frames queued for the thread and not yet written in full
        self._gone = False  # the driver closed its end
        self._thread = threading.Thread(target=self._run, name="phalanx-outbox", daemon=True)
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        frame = _frame(dumps(message))
        with self._lock:
            if self._gone:
                return
            if self._backlog == 0:
                try:
                    sent = self._sock.send(frame, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:  # the driver is gone; the parent-death signal ends us shortly
                    self._gone = True
                    return
                if sent == len(frame):
                    return
                frame = frame[sent:]
            self._backlog += 1
            self._queue.put(frame)

    def send_from_signal_handler(self, message: tuple[Any, ...]) -> None:
        """``send`` for a signal handler, which may interrupt ``send`` in the same thread."""
        threading.Thread(target=self.send, args=(message,), daemon=True).start()

    def _run(self) -> None:
        while (frame := self._queue.get()) is not None:
            try:
                self._sock.sendall(frame)
            except OSError:  # the driver is gone; the parent-death signal ends us shortly
                with self._lock:
                    self._gone = True
                return
            with self._lock:
                self._backlog -= 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._sock.close()


def _frame(data: bytes) -> bytes:
    """``data`` framed as ``multiprocessing.connection.Connection.recv_bytes`` reads it."""
    if len(data) > 0x7FFFFFFF:
        return struct.pack("!iQ", -1, len(data)) + data
    return struct.pack("!i", len(data)) + data


def _install_signal_handlers(outbox: ProcessOutbox, stack_fd: int) -> None:
    """SIGUSR1: dump every thread's stack to the driver's stack file (works even inside C code).
    SIGTERM: a preemption; tell the driver, which answers with a stop round (SIGUSR2)."""
    faulthandler.register(signal.SIGUSR1, file=stack_fd, all_threads=True, chain=False)

    def on_sigterm(signum: int, frame: Any) -> None:
        outbox.send_from_signal_handler(("preempting", time.time()))

    def on_notice(signum: int, frame: Any) -> None:
        from phalanx._internal.worker.session import apply_preemption_notice

        apply_preemption_notice(env.notice_file())

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGUSR2, on_notice)


def _redirect_output(stdout_fd: int, stderr_fd: int) -> None:
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stdout_fd)
    os.close(stderr_fd)
    # The inherited sys.stdout may hold the driver's buffered text and block buffering; start
    # fresh, line-buffered, so each line reaches the driver as it is printed.
    sys.stdout = open(
        1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    sys.stderr = open(
        2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    faulthandler.enable(file=sys.stderr, all_threads=True)


def worker_main(fds: list[int], environ: dict[str, str]) -> int:
    """``fds``: control socket, stdout pipe, stderr pipe, stack-dump file."""
    conn_fd, stdout_fd, stderr_fd, stack_fd = fds
    _redirect_output(stdout_fd, stderr_fd)
    env.update(environ)
    conn = Connection(conn_fd)
    outbox = ProcessOutbox(conn)
    set_outbox(outbox)
    _install_signal_handlers(outbox, stack_fd)
    outbox.send(("hello", os.getpid(), socket.gethostname()))
    try:
        _serve_calls(conn, outbox)
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        outbox.close()
    return 0


def _serve_calls(conn: Connection, outbox: ProcessOutbox) -> None:
    calls = CallLoop(outbox)
    reader = threading.Thread(
        target=_read_control, args=(conn, calls), name="phalanx-control", daemon=True
    )
    reader.start()
    calls.run()


def _read_control(conn: Connection, calls: CallLoop) -> None:
    """The control thread: calls go to the main thread, a reset runs in a thread of its own."""
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            calls.stop()
            return
        if message[0] == "exit":
            calls.stop()
            return
        if message[0] == "call":
            calls.submit(message[1], message[2])
        elif message[0] == "reset":
            threading.Thread(
                target=calls.reset, args=message[1:], name="phalanx-reset", daemon=True
            ).start()


class CallLoop:
    """Runs the driver's calls on the main thread, one at a time, in the order received;
    :meth:`reset` (another thread) ends the one that runs."""

    def __init__(self, outbox: ProcessOutbox) -> None:
        self._outbox = outbox
        self._queue: SimpleQueue[tuple[int, bytes] | None] = SimpleQueue()
        self._calls = InterruptibleCalls(threading.current_thread())

    def submit(self, call_id: int, payload: bytes) -> None:
        self._calls.received()
        self._queue.put((call_id, payload))

    def stop(self) -> None:
        self._queue.put(None)

    def run(self) -> None:
        while (item := self._queue.get()) is not None:
            call_id, payload = item
            ok, value = self._calls.run(payload)
            try:
                self._outbox.send(("ret", call_id, ok, value))
            except Exception as exc:  # the return value does not pickle
                self._outbox.send(("ret", call_id, False, capture_exception(exc)))
            value = None  # its traceback's frames hold the call's objects: drop them now
            self._calls.answered()

    def end_current(self, timeout_s: float) -> bool:
        """End the running call; whether no call runs within ``timeout_s``."""
        return self._calls.end_current(timeout_s)

    def reset(
        self, reset_id: int, timeout_s: float, reset_payload: bytes, abort_payload: bytes | None
    ) -> None:
        """Make this worker reusable by the next attempt; answers ``(ok, why)`` as the return
        of call ``reset_id``."""
        try:
            ok, why = self._reset(timeout_s, reset_payload, abort_payload)
        except BaseException as exc:  # the driver replaces the worker
            ok, why = False, f"{type(exc).__name__}: {exc}"
        self._outbox.send(("ret", reset_id, True, (ok, why)))

    def _reset(
        self, timeout_s: float, reset_payload: bytes, abort_payload: bytes | None
    ) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout_s
        ended = self.end_current(min(ABORT_AFTER_S, timeout_s))
        if not ended and abort_payload is not None:
            ok, value = run_call(abort_payload)
            if not ok:
                return False, f"aborting its process group failed: {value.message}"
        if not ended:
            ended = self.end_current(max(0.0, deadline - time.monotonic()))
        if not ended:
            return False, f"its training call did not end within {timeout_s:g} s"
        kill_descendants(os.getpid())
        gc.collect()  # the ended call's objects (reference cycles too), before the reset
        ok, value = run_call(reset_payload)
        if not ok:
            return False, f"leaving the process group failed: {value.message}"
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        return True, ""
