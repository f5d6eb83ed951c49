"""A fork server: a single-threaded copy of the driver that forks workers on request.

The server is forked from the driver at the start of ``fit()``, so it already holds every module
the driver imported (torch, numpy, ...): a worker forked from it runs its first line in
milliseconds instead of re-importing for a second or more. Because the server is
single-threaded, forking it is safe even when the driver runs threads.

Life and death:
- the server dies with the driver: it gets SIGKILL when the driver dies (parent-death signal),
  and it also notices EOF on its socket to the driver;
- it holds none of the driver's descriptors but stdio and its socket (the others are made
  /dev/null as it starts): the fork copied those of every thread of the driver;
- when the server ends for any reason it SIGKILLs every worker's process group; workers
  also carry a parent-death signal, so none can outlive it;
- each worker is the leader of its own process group, so a terminal's Ctrl-C reaches only the
  driver, and killing a worker's group also kills what the worker started (data loaders, ...);
- the server is a child subreaper: whatever a worker started that leaves its process group
  (``setsid``, ``start_new_session=True``) or outlives it stays a descendant of the server, where
  the engine finds and kills it at the end of every attempt.

Protocol on a SOCK_SEQPACKET socket pair (message boundaries kept, file descriptors passed with
SCM_RIGHTS): driver -> server ``("spawn", index, env)`` + 4 fds (control socket, stdout, stderr,
stack-dump file)
``("preload", modules)`` and ``("stop",)``; server -> driver ``("exited", pid, returncode)``.

:class:`SpawnedForkServer` is the same server started as a fresh interpreter instead of a copy of
the driver: for a driver that initialised a runtime that does not survive a fork (CUDA), it holds
nothing of the driver (no CUDA context, no threads), imports what the workers need once (torch,
the packages the driver's ``__main__`` imported), then forks each worker as fast as the fork
server does. Its workers start a session of their own, as spawned workers do. It is kept warm for
the driver's next ``fit()`` (``warm_server.py``).
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from phalanx._foundation import env as environment
from phalanx._internal.engines.local.fork_safety import release_openmp_threads
from phalanx._internal.engines.local.spawn import _interpreter_flags
from phalanx._internal.engines.process_tree import become_subreaper, set_parent_death_signal

_MAX_MESSAGE = 1 << 16


class ForkServer:
    """Driver-side handle of the fork server. ``on_exit(pid, returncode)`` is called from a thread,
    and ``on_death()`` if the server dies before ``stop()``."""

    label = "fork server"

    def __init__(
        self, on_exit: Callable[[int, int], None], on_death: Callable[[], None] = lambda: None
    ) -> None:
        self._on_exit = on_exit
        self._on_death = on_death
        self._stopping = False
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # or the children would print the driver's pending output again
            except (OSError, ValueError):
                pass
        release_openmp_threads()  # a live OpenMP pool would hang every forked worker
        pid = os.fork()
        if pid == 0:  # the server
            code = 0
            try:
                self._sock.close()
                _drop_inherited_fds(keep=child.fileno())
                _serve(child)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.pid = pid
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="phalanx-forkserver", daemon=True)
        self._reader.start()

    def spawn(self, index: int, fds: list[int], env: dict[str, str]) -> None:
        data = pickle.dumps(("spawn", index, env))
        with self._lock:
            socket.send_fds(self._sock, [data], fds)

    def preload(self, modules: tuple[str, ...]) -> None:
        """Import ``modules`` in the server (between spawns), for workers forked later."""
        with self._lock:
            self._sock.send(pickle.dumps(("preload", modules)))

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(_MAX_MESSAGE)
                if not data:
                    return
                kind, pid, returncode = pickle.loads(data)
                if kind == "exited":
                    self._on_exit(pid, returncode)
        except OSError:
            return
        finally:
            if not self._stopping:  # the server died: workers waiting to start never will
                self._on_death()

    @property
    def alive(self) -> bool:
        return self._reader.is_alive()

    def stop(self, timeout_s: float = 0.2) -> None:
        """Stop the server (it kills any worker still running) and reap it."""
        self._stopping = True
        try:
            with self._lock:
                self._sock.send(pickle.dumps(("stop",)))
        except OSError:
            pass
        # The server may be busy preloading modules for workers that will never come: its
        # workers are gone already, so do not wait for it long.
        self._wait(timeout_s)
        self._sock.close()
        self._reader.join(timeout=5.0)

    def _wait(self, timeout_s: float) -> None:
        _wait_pid(self.pid, timeout_s)


# Before phalanx can be imported: the driver's sys.path (and sys.argv, which libraries read at
# import), as multiprocessing's spawn restores them.
_BOOT = (
    "import sys, json; boot, fd = json.loads(sys.argv[1]), int(sys.argv[2]); "
    "sys.path[:], sys.argv[:] = boot['path'], boot['argv']; "
    "from phalanx._internal.engines.local.forkserver import serve_spawned; "
    "serve_spawned(fd, boot['modules'])"
)


class SpawnedForkServer(ForkServer):
    """A fork server that is a fresh interpreter (see the module docstring): ``modules`` are
    imported in it before it answers, and OSError if it could not start (the engine then spawns
    each worker as a new interpreter)."""

    label = "fork server"

    def __init__(
        self,
        on_exit: Callable[[int, int], None],
        on_death: Callable[[], None] = lambda: None,
        modules: tuple[str, ...] = (),
    ) -> None:
        self._on_exit = on_exit
        self._on_death = on_death
        self._stopping = False
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = json.dumps(
            {"path": sys.path, "argv": getattr(sys, "argv", []), "modules": list(modules)}
        )
        with child:
            self._proc = subprocess.Popen(
                [sys.executable, *_interpreter_flags(), "-c", _BOOT, boot, str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the terminal's Ctrl-C is the driver's alone
            )
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        try:
            self._await_ready(environment.worker_start_timeout_s())
        except BaseException:
            self._proc.kill()
            self._proc.wait()
            self._sock.close()
            raise
        self._reader = threading.Thread(target=self._read, name="phalanx-forkserver", daemon=True)
        self._reader.start()

    def _await_ready(self, timeout_s: float) -> None:
        """Its imports take seconds (torch); every worker waits for them anyway."""
        ready, _, _ = select.select([self._sock], [], [], timeout_s)
        data = self._sock.recv(_MAX_MESSAGE) if ready else b""
        if data and pickle.loads(data) == ("ready",):
            return
        why = f"no answer in {timeout_s:g} s"
        if ready:  # its end of the socket closed: it is exiting
            try:
                why = f"exit code {self._proc.wait(timeout=5.0)}"
            except subprocess.TimeoutExpired:
                why = "it closed its socket"
        raise OSError(f"the fork server (a fresh interpreter) did not start: {why}")

    def rebind(self, on_exit: Callable[[int, int], None], on_death: Callable[[], None]) -> None:
        """Report to another engine from now on (the server is reused by a later ``fit()``)."""
        self._on_exit, self._on_death = on_exit, on_death

    def reusable(self) -> bool:
        """Alive and not stopping: it can fork the workers of another ``fit()``."""
        return not self._stopping and self._proc.poll() is None and self.alive

    def _wait(self, timeout_s: float) -> None:
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def main_imports() -> tuple[str, ...]:
    """The top-level packages a fresh fork server imports for its workers: torch if the driver
    imported it, and the non-standard packages the driver's ``__main__`` (a script, a notebook)
    imported, as a fork server forked from the driver would hold them."""
    names = {"torch"} & set(sys.modules)
    main = sys.modules.get("__main__")
    for value in list(vars(main).values()) if main is not None else []:
        try:  # a notebook's globals may hold lazy proxies that raise on any attribute
            module = value.__name__ if isinstance(value, types.ModuleType) else None
            module = module or getattr(value, "__module__", None)
        except Exception:
            continue
        if isinstance(module, str):
            names.add(module.partition(".")[0])
    return tuple(
        sorted(
            name
            for name in names
            if name
            and not name.startswith("_")
            and name not in sys.stdlib_module_names
            and name in sys.modules
        )
    )


def _wait_pid(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.005)


# --- the server process ----------------------------------------------------------------------


def serve_spawned(fd: int, modules: list[str]) -> None:
    """The spawned fork server's entry point (see :class:`SpawnedForkServer`). Never returns."""
    code = 0
    try:
        set_parent_death_signal()
        sock = socket.socket(fileno=fd)
        _preload(tuple(modules))
        from phalanx._internal.engines.local.start_method import fork_unsafe_runtime

        runtime = fork_unsafe_runtime()
        if runtime is not None:  # an import initialised it: forked workers could not use it
            raise RuntimeError(f"importing {modules} initialised {runtime} in the fork server")
        release_openmp_threads()  # a module's import-time torch op would hang forked workers
        sock.send(pickle.dumps(("ready",)))
        _serve(sock, own_session=True)
    except BaseException:
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _drop_inherited_fds(keep: int) -> None:
    """In the server just forked from the driver: every file descriptor but stdio and ``keep``
    made /dev/null. The fork copied every descriptor the driver's other threads held at that
    instant (another ``fit()`` of a sweep's trial: its own server's socket end, a worker's
    pipes before the driver closed them); a copy held here kept their ends from ever seeing EOF
    (that fit() waited for this server to stop before it returned). /dev/null rather than
    close: a stale object of the driver's that closes its descriptor later (in a worker) must
    not close a socket that reused the number."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: keep what was inherited
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd > 2 and fd not in (keep, null):
            try:
                os.fstat(fd)  # not the descriptor listdir itself used (closed already)
            except OSError:
                continue
            os.dup2(null, fd, inheritable=False)
    os.close(null)


def _serve(sock: socket.socket, own_session: bool = False) -> None:
    set_parent_death_signal()
    become_subreaper()
    if not own_session:  # a spawned server leads its own session already
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    try:
        while True:
            readers: list[Any] = [sock, wake_r]
            ready, _, _ = select.select(readers, [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(sock, children)
            wake = (wake_r, wake_w)
            if sock in ready and not _handle_request(sock, children, wake, own_session):
                return
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in list(children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Reap every child: workers (reported to the driver) and orphans re-parented to us."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in children:
            continue
        children.discard(pid)
        try:
            sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))
        except OSError:
            pass


def _handle_request(
    sock: socket.socket, children: set[int], wake: tuple[int, int], own_session: bool
) -> bool:
    try:
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 8)
    except OSError:
        return False
    if not data:  # the driver is gone
        return False
    message = pickle.loads(data)
    if message[0] == "stop":
        return False
    if message[0] == "preload":
        _preload(message[1])
        return True
    _, _index, env = message
    pid = os.fork()
    if pid == 0:
        sock.close()
        for fd in wake:
            os.close(fd)
        _become_worker(fds, env, own_session)
    for fd in fds:
        os.close(fd)
    children.add(pid)
    return True


def _preload(modules: tuple[str, ...]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # a worker that needs it will raise the real error itself
            pass


def _become_worker(fds: list[int], env: dict[str, str], own_session: bool) -> None:
    code = 1
    try:
        if own_session:
            os.setsid()
        else:
            os.setpgid(0, 0)
        set_parent_death_signal()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from phalanx._internal.engines.local.worker_main import worker_main

        code = worker_main(fds, env)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)
