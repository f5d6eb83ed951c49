"""The driver's terminal, shared by worker output and the progress view.

Worker output arrives in pieces: whole lines, and partial lines (a tqdm bar redrawn after each
``\\r``, a ``pdb`` prompt waiting for input) forwarded after a short idle time. Each source keeps
a :class:`LineState` so ``[rank0]: `` goes at the start of every line and after every ``\\r``.
When one rank (or the driver) writes while another's line is still open, the open line is ended
first, so two ranks never share a line. The progress view draws one status line at the bottom; every write
erases it first and redraws it afterwards, unless a worker's line is open (a bar or a prompt
owns the cursor; the view yields to it until that line ends).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import IO

ERASE_LINE = "\r\x1b[2K"


class LineState:
    """Where one source (a rank's stdout or stderr, or the driver's own prints) is in its line."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last = "\n"  # the last character written: a prefix is due after "\n" or "\r"
        self.stream_name = "stdout"

    @property
    def open(self) -> bool:
        return self.last != "\n"

    def render(self, text: str) -> str:
        if not self.prefix:
            self.last = text[-1] if text else self.last
            return text
        out: list[str] = []
        for ch in _pieces(text):
            if ch in "\r\n":
                if ch == "\n" and self.last == "\n":  # an empty line still names its rank
                    out.append(self.prefix.rstrip())
                out.append(ch)
            else:
                if self.last in "\r\n":
                    out.append(self.prefix)
                out.append(ch)
            self.last = ch[-1]
        return "".join(out)


def _pieces(text: str) -> list[str]:
    """``"a\\rbc\\n"`` -> ``["a", "\\r", "bc", "\\n"]``."""
    pieces: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch in "\r\n":
            if i > start:
                pieces.append(text[start:i])
            pieces.append(ch)
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


class Terminal:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open: LineState | None = None
        self._status: Callable[[], str] | None = None
        self._shown = False
        self._real: dict[str, IO[str]] = {}

    def stream(self, name: str) -> IO[str]:
        real = self._real.get(name)
        return real if real is not None else getattr(sys, name)  # type: ignore[no-any-return]

    def write(self, state: LineState, stream_name: str, text: str) -> None:
        """Write ``text`` from ``state``'s source, prefixed, without garbling the status line."""
        if not text:
            return
        with self._lock:
            self._hide()
            other = self._open
            if other is not None and other.prefix != state.prefix:  # another rank's line
                self._end_line(other)
            state.stream_name = stream_name
            stream = self.stream(stream_name)
            stream.write(state.render(text))
            stream.flush()
            self._open = state if state.open else None
            self._show()

    def _end_line(self, state: LineState) -> None:
        stream = self.stream(state.stream_name)
        stream.write("\n")
        stream.flush()
        state.last = "\n"
        self._open = None

    # -- the status line (the progress view) ----------------------------------------------------

    def attach_status(self, render: Callable[[], str]) -> bool:
        """Show ``render()`` as the bottom line; driver prints go through :meth:`write` too.
        False when a view is shown already (a second fit() in another thread shows none)."""
        with self._lock:
            if self._status is not None:
                return False
            self._real = {"stdout": sys.stdout, "stderr": sys.stderr}
            self._status = render
            sys.stdout = _DriverStream(self, "stdout")  # type: ignore[assignment]
            sys.stderr = _DriverStream(self, "stderr")  # type: ignore[assignment]
            self._show()
            return True

    def detach_status(self) -> None:
        with self._lock:
            self._hide()
            self._status = None
            for name, real in self._real.items():
                if isinstance(getattr(sys, name), _DriverStream):
                    setattr(sys, name, real)
            self._real = {}
            if self._open is not None:
                self._end_line(self._open)

    def refresh(self) -> None:
        with self._lock:
            self._hide()
            self._show()

    def _hide(self) -> None:
        if self._shown:
            err = self.stream("stderr")
            err.write(ERASE_LINE)
            err.flush()
            self._shown = False

    def _show(self) -> None:
        if self._status is None or self._open is not None:
            return
        try:
            line = self._status()
        except Exception:  # the view must never break the output it sits under
            return
        err = self.stream("stderr")
        err.write(ERASE_LINE + line)
        err.flush()
        self._shown = True


class _DriverStream:
    """``sys.stdout``/``sys.stderr`` while the view is shown: the driver's own prints (a
    callback's, a log handler's) go above the status line instead of into it."""

    def __init__(self, terminal: Terminal, name: str) -> None:
        self._terminal = terminal
        self._name = name
        self._state = LineState("")

    def write(self, text: str) -> int:
        self._terminal.write(self._state, self._name, text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self._terminal.stream(self._name).isatty()

    def fileno(self) -> int:
        return self._terminal.stream(self._name).fileno()

    def __getattr__(self, name: str) -> object:
        return getattr(self._terminal.stream(self._name), name)


TERMINAL = Terminal()
