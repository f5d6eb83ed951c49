"""The main loop of a worker process (local engine): receive calls, run them, send results.

Calls run in the main thread, so the user's training function gets the main thread (signal
handlers, libraries that insist on it). ``report()`` pickles and hands the bytes to the kernel
without waiting for the driver; a sender thread writes what the socket cannot take at once.
"""

from __future__ import annotations

import faulthandler
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

from phalanx._internal import env
from phalanx._internal.worker.runtime import capture_exception, dumps, run_call, set_outbox


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
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if message[0] == "exit":
            return
        if message[0] != "call":
            continue
        _, call_id, payload = message
        ok, value = run_call(payload)
        try:
            outbox.send(("ret", call_id, ok, value))
        except Exception as exc:  # the return value does not pickle
            outbox.send(("ret", call_id, False, capture_exception(exc)))
