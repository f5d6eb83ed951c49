"""One fresh fork server kept warm across ``fit()`` calls of a driver process.

A driver that initialised CUDA forks its workers from a fresh interpreter
(:class:`~phalanx._internal.engines.local.forkserver.SpawnedForkServer`), which imports torch and
the driver's ``__main__`` packages before it answers: a second or more per ``fit()``. A notebook
runs ``fit()`` again and again, so the server outlives the engine that started it: ``close()``
parks it here and the next ``fit()`` takes it back when it would start the same server, that is
when nothing a worker inherits from it at its start has changed since:

- the driver's environment variables, working directory, ``sys.path``, ``sys.argv`` and
  interpreter (a library reads them at import: torch its thread count);
- the source files of the non-installed modules the driver imported (the user's own code,
  editable installs): an edited and reloaded module must not run in its old form;
- the modules it imported are a superset of what the new ``fit()`` wants preloaded; missing ones
  are imported in the parked server instead (what a fresh server would do).

Otherwise the parked server is stopped and a new one started. At most one server is parked; it
dies with the driver (parent-death signal) and is stopped at exit. Only a server started from the
main thread is parked: its parent-death signal fires when the thread that started it ends.
"""

from __future__ import annotations

import atexit
import os
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from phalanx._foundation import env as environment
from phalanx._internal.engines.local.forkserver import SpawnedForkServer
from phalanx._internal.engines.local.spawn import _interpreter_flags
from phalanx._internal.engines.process_tree import kill_descendants


@dataclass(frozen=True)
class ServerKey:
    """What a fresh fork server would inherit from the driver at its start."""

    interpreter: tuple[str, ...]
    cwd: str
    path: tuple[str, ...]
    argv: tuple[str, ...]
    environ: frozenset[tuple[str, str]]
    sources: frozenset[tuple[str, int]]  # (file, mtime_ns) of the driver's non-installed modules


@dataclass
class _Parked:
    server: SpawnedForkServer
    key: ServerKey
    modules: frozenset[str]
    owner_pid: int  # a forked copy of the driver must not use its parent's server


_lock = threading.Lock()
_parked: _Parked | None = None
# Each server taken and not yet given back: its key, the modules it imported, parkable or not.
_taken: weakref.WeakKeyDictionary[SpawnedForkServer, tuple[ServerKey, frozenset[str], bool]] = (
    weakref.WeakKeyDictionary()
)
_atexit_registered = False


def take(
    on_exit: Callable[[int, int], None], on_death: Callable[[], None], modules: tuple[str, ...]
) -> SpawnedForkServer:
    """The parked server when it fits the driver as it is now (rebound to these callbacks, the
    missing ``modules`` imported in it), else a new one (OSError if it cannot start)."""
    global _parked
    key = current_key()
    with _lock:
        parked, _parked = _parked, None
    if parked is not None and parked.owner_pid == os.getpid():
        if parked.key == key and parked.server.reusable():
            parked.server.rebind(on_exit, on_death)
            missing = tuple(m for m in modules if m not in parked.modules)
            if missing:
                parked.server.preload(missing)
            _taken[parked.server] = (key, parked.modules | set(missing), True)
            return parked.server
        _stop(parked.server)
    server = SpawnedForkServer(on_exit, on_death, modules=modules)
    parkable = threading.current_thread() is threading.main_thread()
    _taken[server] = (key, frozenset(modules), parkable)
    return server


def give_back(server: SpawnedForkServer) -> None:
    """Park ``server`` (idle: its workers are gone) for the next ``fit()``, or stop it."""
    global _parked, _atexit_registered
    key, modules, parkable = _taken.pop(server, (None, frozenset(), False))
    if key is None or not parkable or not server.reusable():
        _stop(server)
        return
    server.rebind(_ignore_exit, _ignore_death)
    with _lock:
        previous, _parked = _parked, _Parked(server, key, modules, os.getpid())
        if not _atexit_registered:
            atexit.register(shut_down)
            _atexit_registered = True
    if previous is not None:  # two fits ran side by side: keep the newer one
        _stop(previous.server)


def shut_down() -> None:
    """Stop the parked server, if any (at exit; tests call it to end each test clean)."""
    global _parked
    with _lock:
        parked, _parked = _parked, None
    if parked is not None and parked.owner_pid == os.getpid():
        _stop(parked.server)


def parked_pid() -> int | None:
    """The parked server's pid (None when none is parked)."""
    parked = _parked
    return parked.server.pid if parked is not None else None


def current_key() -> ServerKey:
    return ServerKey(
        interpreter=(sys.executable, *_interpreter_flags()),
        cwd=os.getcwd(),
        path=tuple(sys.path),
        argv=tuple(getattr(sys, "argv", [])),
        environ=frozenset(environment.child_environment({}).items()),
        sources=_own_sources(),
    )


def _own_sources() -> frozenset[tuple[str, int]]:
    """(file, mtime_ns) of every imported module that is not in the standard library or an
    installed package: the files a user edits between two fits."""
    paths = sysconfig.get_paths()
    roots = [
        paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths
    ]
    installed = tuple({os.path.join(p, "") for r in roots for p in (r, os.path.realpath(r))})
    found = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or file.startswith(installed):
            continue
        if os.path.realpath(file).startswith(installed):  # a link into an installed tree
            continue
        try:
            found.add((file, os.stat(file).st_mtime_ns))
        except OSError:  # a module from a zip or a deleted file: nothing to compare
            continue
    return frozenset(found)


def _stop(server: SpawnedForkServer) -> None:
    _taken.pop(server, None)
    kill_descendants(server.pid)
    server.stop()


def _ignore_exit(pid: int, returncode: int) -> None:
    """A late exit of a worker of the fit that parked the server: that engine is closed."""


def _ignore_death() -> None:
    """The parked server died (no worker is waiting on it): the next take() starts another."""
