"""One driver thread that reads every local worker's control socket and output pipes.

Workers write their messages straight into their control socket from the thread that calls
``report()`` (see ``worker_main.py``). A send that wakes a waiting reader costs the
worker several times what one into a socket nobody waits on costs (a wake-up). So after a round that read
messages the pump pauses ``COALESCE_S`` before it waits again: reports that come in that pause
are cheap for the worker and read together, and the pause is a small share of any step longer
than it.
"""

from __future__ import annotations

import codecs
import os
import selectors
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from phalanx._internal.engines.rank_output import RankOutput

IDLE_S = 0.03  # a partial line is forwarded after this long without more output
COALESCE_S = 0.002  # the pause after a round that read messages (see the module docstring)
_READ_SIZE = 1 << 20


def _decoder() -> codecs.IncrementalDecoder:
    """Keeps a character split between two reads whole."""
    return codecs.getincrementaldecoder("utf-8")("backslashreplace")


@dataclass(frozen=True)
class _Worker:
    """What the pump knows of one worker: its connection and whom to tell what it read."""

    index: int
    conn: Connection
    on_message: Callable[[bytes], None]  # one whole message, still pickled
    on_disconnect: Callable[[], None]  # the worker closed its end (it is gone)
    on_error: Callable[[BaseException], None]  # reading or handling its messages failed


class OutputPump:
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._pending: list[Callable[[], None]] = []
        self._open: dict[int, set[int]] = {}  # worker index -> fds still open
        self._conns: dict[int, tuple[Connection, int]] = {}  # worker index -> (conn, its fd)
        self._outputs: dict[int, RankOutput] = {}  # worker index -> its output (and log files)
        self._states: dict[int, list[list[Any]]] = {}  # worker index -> its streams' states
        self._inbox: dict[int, bytearray] = {}  # control socket fd -> bytes not yet a message
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = False
        self._idle: dict[int, tuple[float, str, list[Any]]] = {}  # fd -> partial line's flush
        self._thread = threading.Thread(target=self._run, name="phalanx-pump", daemon=True)
        self._thread.start()

    # -- called from the controller's thread ----------------------------------------------------

    def add_worker(
        self,
        index: int,
        conn: Connection,
        out_fd: int,
        err_fd: int,
        output: RankOutput,
        *,
        on_message: Callable[[bytes], None],
        on_disconnect: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Read worker ``index``'s messages from ``conn`` and its output from ``out_fd`` and
        ``err_fd`` (the pump owns all three from now on). The callbacks run in the pump thread;
        an exception ``on_message`` raises goes to ``on_error``."""
        worker = _Worker(index, conn, on_message, on_disconnect, on_error)
        conn_fd = conn.fileno()
        self._open[index] = {conn_fd, out_fd, err_fd}
        self._conns[index] = (conn, conn_fd)
        self._outputs[index] = output

        states: list[list[Any]] = [[_decoder(), output, ""] for _ in range(2)]
        self._states[index] = states  # each: decoder, RankOutput, partial line

        def register() -> None:
            self._selector.register(conn_fd, selectors.EVENT_READ, ("conn", worker, None))
            for fd, stream, state in ((out_fd, "stdout", states[0]), (err_fd, "stderr", states[1])):
                self._selector.register(fd, selectors.EVENT_READ, (stream, worker, state))

        self._call_soon(register)

    def rebind_output(self, index: int, output: RankOutput) -> None:
        """Worker ``index`` (kept by in-place recovery) writes to ``output`` from now on (the
        next attempt's rank prefix and log file); its old output is closed."""
        old = self._outputs.get(index)
        self._outputs[index] = output
        states = self._states.get(index, [])

        def swap() -> None:
            for state in states:
                state[1] = output
            if old is not None and old is not output:
                old.close()

        self._call_soon(swap)

    def remove_worker(self, index: int, timeout_s: float = 1.0) -> None:
        """Wait (bounded) until the worker's pipes are drained, then forget it."""
        deadline = time.monotonic() + timeout_s
        while self._open.get(index) and time.monotonic() < deadline:
            time.sleep(0.002)
        leftover = self._open.pop(index, set())
        conn, conn_fd = self._conns.pop(index, (None, -1))
        output = self._outputs.pop(index, None)
        self._states.pop(index, None)

        def unregister() -> None:
            for fd in leftover:
                if fd != conn_fd:
                    self._close_fd(fd)
                elif conn is not None and not conn.closed:
                    self._inbox.pop(fd, None)
                    self._selector.unregister(fd)
                    conn.close()
            if output is not None:  # its pipes may never have reached EOF: close its log files
                output.close()

        self._call_soon(unregister)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _call_soon(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append(fn)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    # -- the pump thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._run_once()
        except BaseException as exc:  # nothing may leave fit() waiting for a dead reader
            self._on_death(exc)
            raise

    def _run_once(self) -> None:
        read_messages = False
        for key, _ in self._selector.select(timeout=self._select_timeout()):
            if key.data is None:
                os.read(self._wake_r, 4096)
                continue
            kind, worker, state = key.data
            try:
                if kind == "conn":
                    read_messages = True
                    self._read_conn(key.fd, worker)
                else:
                    self._read_output(key.fd, kind, worker.index, state)
            except Exception as exc:  # one worker's problem fails that worker, not the pump
                worker.on_error(exc)
                if kind != "conn":  # or a broken output stream would spin here
                    self._close_fd(key.fd)
                    self._mark_closed(worker.index, key.fd)
        self._flush_idle()
        with self._lock:
            pending, self._pending = self._pending, []
        for fn in pending:
            fn()
        if read_messages and not self._stopping:
            time.sleep(COALESCE_S)

    def _on_death(self, exc: BaseException) -> None:
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                key.data[1].on_error(exc)

    def _read_conn(self, fd: int, worker: _Worker) -> None:
        """Read what the socket holds (often several messages) and hand over each whole one."""
        try:
            chunk = os.read(fd, _READ_SIZE)
        except OSError:
            chunk = b""
        if not chunk:  # the worker is gone; a partial message left behind is not a message
            self._inbox.pop(fd, None)
            worker.on_disconnect()
            self._selector.unregister(fd)
            worker.conn.close()
            self._mark_closed(worker.index, fd)
            return
        buffer = self._inbox.setdefault(fd, bytearray())
        buffer += chunk
        start = 0
        try:
            while (frame := _next_frame(buffer, start)) is not None:
                data, start = frame
                worker.on_message(data)
        finally:
            del buffer[:start]

    def _read_output(self, fd: int, kind: str, index: int, state: list[Any]) -> None:
        chunk = os.read(fd, 1 << 16)
        decoder, output = state[0], state[1]
        text = state[2] + decoder.decode(chunk, final=not chunk)
        # Whole lines go at once; a partial line (a bar, a prompt) IDLE_S after its first
        # byte came, so a line printed in pieces is rarely cut, and a bar redrawn faster than
        # IDLE_S still moves.
        cut = len(text) if not chunk else text.rfind("\n") + 1
        state[2] = text[cut:]
        output.write(text[:cut], kind)
        if not state[2]:
            self._idle.pop(fd, None)
        elif fd not in self._idle:
            self._idle[fd] = (time.monotonic() + IDLE_S, kind, state)
        if not chunk:
            self._close_fd(fd)
            self._mark_closed(index, fd)
            if not self._open.get(index):
                output.close()

    def _flush_idle(self) -> None:
        now = time.monotonic()
        for fd, (deadline, kind, state) in list(self._idle.items()):
            if deadline <= now:
                del self._idle[fd]
                text, state[2] = state[2], ""
                state[1].write(text, kind)

    def _select_timeout(self) -> float:
        if not self._idle:
            return 1.0
        soonest = min(deadline for deadline, _, _ in self._idle.values())
        return max(0.0, soonest - time.monotonic())

    def _close_fd(self, fd: int) -> None:
        self._idle.pop(fd, None)
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            return
        try:
            os.close(fd)
        except OSError:
            pass

    def _mark_closed(self, index: int, fd: int) -> None:
        fds = self._open.get(index)
        if fds is not None:
            fds.discard(fd)


def _next_frame(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """The message at ``start`` (framed as ``multiprocessing.connection`` frames it) and where
    the next one starts, or None when it has not fully arrived."""
    if len(buffer) - start < 4:
        return None
    (size,) = struct.unpack_from("!i", buffer, start)
    head = 4
    if size == -1:  # over 2 GiB: an 8-byte size follows
        if len(buffer) - start < 12:
            return None
        (size,) = struct.unpack_from("!Q", buffer, start + 4)
        head = 12
    end = start + head + size
    if len(buffer) < end:
        return None
    with memoryview(buffer) as view:  # released at once: the buffer is resized after
        return bytes(view[start + head : end]), end
