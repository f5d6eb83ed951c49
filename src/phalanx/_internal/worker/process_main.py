"""The main loop of a worker process (local engine): receive calls, run them, send results.

Calls run in the main thread, so the user's training function gets the main thread (signal
handlers, libraries that insist on it). One sender thread writes everything the worker sends,
so ``report()`` only pickles and enqueues.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import socket
import sys
import threading
from multiprocessing.connection import Connection
from queue import SimpleQueue
from typing import Any

from phalanx._internal.worker.runtime import capture_exception, dumps, run_call, set_outbox


class ProcessOutbox:
    """Pickles in the caller's thread (a snapshot of the metrics) and sends from a thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: SimpleQueue[bytes | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="phalanx-outbox", daemon=True)
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        self._queue.put(dumps(message))

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._conn.send_bytes(data)
            except OSError:  # the driver is gone; the parent-death signal ends us shortly
                return

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


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
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)


def worker_main(conn_fd: int, stdout_fd: int, stderr_fd: int, env: dict[str, str]) -> int:
    _redirect_output(stdout_fd, stderr_fd)
    os.environ.update(env)
    conn = Connection(conn_fd)
    outbox = ProcessOutbox(conn)
    set_outbox(outbox)
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
        _, call_id, payload = message
        ok, value = run_call(payload)
        try:
            outbox.send(("ret", call_id, ok, value))
        except Exception as exc:  # the return value does not pickle
            outbox.send(("ret", call_id, False, capture_exception(exc)))
