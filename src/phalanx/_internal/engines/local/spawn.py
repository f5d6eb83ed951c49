"""The spawn path's driver side: a handle on the spawn server (see ``spawn_server.py``), with the
same interface as :class:`~phalanx._internal.engines.local.forkserver.ForkServer`.

Each worker is a new interpreter started with the driver's interpreter flags and ``sys.path``
(so a training function pickled by reference imports the same modules), in the driver's working
directory and with the driver's environment at the time of the launch, plus the worker group's
variables. It runs :mod:`.spawn_main`, which watches its lifeline and then serves calls exactly
as a forked worker does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from phalanx._foundation import env as environment
from phalanx._internal.engines.local import spawn_server
from phalanx._internal.engines.local.spawn_server import Channel

# Before phalanx can be imported: the driver's sys.path (and sys.argv, which libraries read at
# import), as multiprocessing's spawn restores them.
_BOOT = (
    "import sys, json; boot, fds = json.loads(sys.argv[1]), sys.argv[2:]; "
    "sys.path[:], sys.argv[:] = boot['path'], boot['argv']; "
    "from phalanx._internal.engines.local.spawn_main import main; main(fds)"
)
_SPAWN_TIMEOUT_S = 30.0  # starting a process takes milliseconds; this is a stuck server


class SpawnServer:
    """Driver-side handle of the spawn server. ``on_exit(pid, returncode)`` is called from a
    thread, and ``on_death()`` if the server dies before ``stop()``."""

    label = "spawn server"

    def __init__(
        self, on_exit: Callable[[int, int], None], on_death: Callable[[], None] = lambda: None
    ) -> None:
        self._on_exit = on_exit
        self._on_death = on_death
        self._stopping = False
        sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with child:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", spawn_server.__file__, str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the terminal's Ctrl-C is the driver's alone
            )
        self.pid = self._proc.pid
        self._channel = Channel(sock)
        self._lock = threading.Lock()
        self._replies: dict[int, Future[int]] = {}
        self._dead = False  # the reader saw the server's end
        self._reader = threading.Thread(target=self._read, name="phalanx-spawnserver", daemon=True)
        self._reader.start()

    def spawn(self, index: int, fds: list[int], env: dict[str, str]) -> None:
        """Start worker ``index`` with ``fds`` (control socket, stdout, stderr, stack file);
        OSError if it could not be started."""
        reply = Future[int]()
        boot = json.dumps({"path": sys.path, "argv": getattr(sys, "argv", [])})
        argv = [sys.executable, *_interpreter_flags(), "-c", _BOOT, boot]
        request = ("spawn", index, argv, environment.child_environment(env), os.getcwd())
        with self._lock:
            if self._dead:
                raise ConnectionError(f"the spawn server (pid {self.pid}) is gone")
            self._replies[index] = reply
            self._channel.send(request, fds)
        reply.result(timeout=_SPAWN_TIMEOUT_S)

    def preload(self, modules: tuple[str, ...]) -> None:
        """Nothing to do: each spawned worker imports what its function needs."""

    def _read(self) -> None:
        try:
            while (messages := self._channel.receive()) is not None:
                for message in messages:
                    self._on_message(message)
        except OSError:
            return
        finally:
            with self._lock:
                self._dead = True
                replies, self._replies = self._replies, {}
            error = ConnectionError(f"the spawn server (pid {self.pid}) died")
            for reply in replies.values():
                reply.set_exception(error)
            if not self._stopping:  # the server died: workers waiting to start never will
                self._on_death()

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "exited":
            self._on_exit(message[1], message[2])
        elif kind in ("spawned", "failed"):
            reply = self._replies.pop(message[1], None)  # no lock: spawn() may hold it
            if reply is None:
                return
            if kind == "spawned":
                reply.set_result(message[2])
            else:
                reply.set_exception(OSError(f"could not start worker {message[1]}: {message[2]}"))

    @property
    def alive(self) -> bool:
        return self._reader.is_alive()

    def stop(self, timeout_s: float = 0.2) -> None:
        """Stop the server (it kills any worker still running) and reap it."""
        self._stopping = True
        try:
            with self._lock:
                self._channel.send(("stop",))
        except OSError:
            pass
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._channel.sock.close()
        self._reader.join(timeout=5.0)


def _interpreter_flags() -> list[str]:
    """The driver's interpreter options (``-O``, ``-X ...``, ``-W ...``), as multiprocessing
    passes them to the processes it spawns."""
    flags = getattr(subprocess, "_args_from_interpreter_flags", None)
    return list(flags()) if flags is not None else []


__all__ = ["SpawnServer"]
