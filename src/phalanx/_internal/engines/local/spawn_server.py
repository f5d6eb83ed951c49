"""The spawn server: a small, fresh Python process that starts each worker as a new interpreter.

Run as a script (``python -I -S spawn_server.py FD``) by :mod:`.spawn`: it imports only the
standard library, so it starts in milliseconds, holds nothing of the driver (no CUDA context, no
threads) and runs on every POSIX platform. It is the spawn path's counterpart of the fork server,
with the same duties:

- it starts each worker (``subprocess``: fork and exec at once, safe on macOS) in a new session,
  so a terminal's Ctrl-C reaches only the driver and killing the worker's process group also
  kills what the worker started;
- it reaps its children and tells the driver ``("exited", pid, returncode)``;
- on Linux it is a child subreaper, so what a worker started and left behind stays a descendant
  of the server, where the engine finds and kills it;
- it dies with the driver without ``prctl``: EOF on its socket means the driver is gone, and it
  kills every worker's process group before it exits;
- each worker watches a pipe whose write end only this server holds (a "lifeline"): when the
  server dies, even by SIGKILL, every worker sees EOF and kills its own process group.

Protocol on a SOCK_STREAM socket pair, each message a 4-byte big-endian length and a pickle:
driver -> server ``("spawn", index, argv, env, cwd)`` with 4 fds (control socket, stdout, stderr,
stack-dump file) sent with the message's first byte, and ``("stop",)``; server -> driver
``("spawned", index, pid)``, ``("failed", index, message)`` and ``("exited", pid, returncode)``.
The worker gets the control socket, stack file and lifeline as extra arguments, in that order.
"""

from __future__ import annotations

import array
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

_HEADER = struct.Struct("!I")
_FDS_PER_SPAWN = 4
_PR_SET_CHILD_SUBREAPER = 36


class Channel:
    """Length-prefixed pickles over a SOCK_STREAM socket, with file descriptors alongside."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self.fds: list[int] = []  # received, not yet taken by a message

    def send(self, message: tuple[Any, ...], fds: list[int] | None = None) -> None:
        data = pickle.dumps(message)
        frame = _HEADER.pack(len(data)) + data
        if fds:
            sent = socket.send_fds(self.sock, [frame], fds)
            frame = frame[sent:]
        if frame:
            self.sock.sendall(frame)

    def receive(self) -> list[tuple[Any, ...]] | None:
        """What one read brings (possibly nothing whole yet); None at EOF."""
        fds = array.array("i")
        flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
        data, ancdata, msg_flags, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(64 * 4), flags)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        for fd in fds:
            os.set_inheritable(fd, False)
        self.fds.extend(fds)
        if msg_flags & getattr(socket, "MSG_CTRUNC", 0):
            raise OSError("file descriptors were cut off")
        if not data:
            return None
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            messages.append(pickle.loads(self._buffer[_HEADER.size : _HEADER.size + size]))
            del self._buffer[: _HEADER.size + size]
        return messages

    def take_fds(self, count: int) -> list[int]:
        taken, self.fds = self.fds[:count], self.fds[count:]
        return taken


def serve(fd: int) -> None:
    channel = Channel(socket.socket(fileno=fd))
    _become_subreaper()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    lifeline_r, lifeline_w = os.pipe()  # the write end never leaves this process
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, subprocess.Popen[bytes]] = {}
    readers: list[Any] = [channel.sock, wake_r]
    try:
        while True:
            ready, _, _ = select.select(readers, [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(channel, children)
            if channel.sock in ready and not _handle(channel, children, lifeline_r):
                return
    finally:
        _kill_all(children)
        os.close(lifeline_w)


def _handle(channel: Channel, children: dict[int, Any], lifeline: int) -> bool:
    try:
        messages = channel.receive()
    except OSError:
        return False
    if messages is None:  # the driver is gone
        return False
    for message in messages:
        if message[0] == "stop":
            return False
        if message[0] == "spawn":
            _spawn(channel, children, message, lifeline)
    return True


def _spawn(
    channel: Channel, children: dict[int, Any], message: tuple[Any, ...], lifeline: int
) -> None:
    _, index, argv, env, cwd = message
    conn, out, err, stack = channel.take_fds(_FDS_PER_SPAWN)
    try:
        proc = subprocess.Popen(
            [*argv, str(conn), str(stack), str(lifeline)],
            stdout=out,
            stderr=err,
            pass_fds=(conn, stack, lifeline),
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except Exception as exc:
        channel.send(("failed", index, f"{type(exc).__name__}: {exc}"))
    else:
        children[proc.pid] = proc
        channel.send(("spawned", index, proc.pid))
    finally:
        for fd in (conn, out, err, stack):  # or the driver would never see the worker's EOF
            os.close(fd)


def _reap(channel: Channel, children: dict[int, Any]) -> None:
    """Reap every child: workers (reported to the driver) and orphans re-parented to us."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        proc = children.pop(pid, None)
        if proc is None:
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        try:
            channel.send(("exited", pid, proc.returncode))
        except OSError:
            pass


def _kill_all(children: dict[int, Any]) -> None:
    """SIGKILL every worker's process group, then every process left in this server's tree."""
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid, proc in list(children.items()):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        proc.returncode = -signal.SIGKILL
    _kill_orphans()


def _kill_orphans(timeout_s: float = 2.0) -> None:
    """SIGKILL and reap what workers left behind: as a subreaper (Linux), the server is their
    parent now. Repeated, because each one killed hands its own children to the server."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + timeout_s
    me = str(os.getpid()).encode()
    while time.monotonic() < deadline:
        orphans = _children_of(me)
        if not orphans:
            return
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _children_of(parent: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # the name may hold spaces and ')'
        if len(fields) > 1 and fields[1] == parent:
            found.append(int(entry))
    return found


def _become_subreaper() -> None:
    """Orphaned descendants of the server are re-parented to it, not to init (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
        pass


if __name__ == "__main__":
    serve(int(sys.argv[1]))
