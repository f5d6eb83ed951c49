"""The output of a Ray actor's process, sent to the driver as messages.

File descriptors 1 and 2 go to pipes that a thread reads into ``("out", stream, text)``
messages in the actor's outbox, whole lines at once and a partial line (a progress bar, a
prompt) after a short idle time: the driver prints them with the rank prefix and writes the
rank's log file.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx._internal.engines.ray.actor import MessageBuffer

# Lines Ray's log monitor uses to attribute worker output; they mean nothing to the user.
_RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")
_STREAMS = ((1, "stdout"), (2, "stderr"))
IDLE_S = 0.03  # a partial line is sent after this long without more output


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
