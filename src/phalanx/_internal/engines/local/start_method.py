"""How the local engine starts its workers: ``fork`` (a fork server) or ``spawn`` (fresh
interpreters).

``fork`` is the fast path: a copy of the driver forks each worker, which already holds every
module the driver imported. It needs Linux (``SOCK_SEQPACKET`` for ``AF_UNIX``, ``prctl``) and a
driver that is safe to copy. ``spawn`` starts each worker as a new Python interpreter: it works on
every POSIX platform and after the driver initialised a runtime that does not survive a fork
(CUDA: "Cannot re-initialize CUDA in forked subprocess"; JAX's backends), at the cost of
re-importing.

Chosen in this order: ``PHALANX_START_METHOD``, then ``spawn`` off Linux, then ``spawn`` when
the driver has initialised CUDA or JAX or is connected to Ray, else ``fork``. The ``spawn`` chosen
for such a driver on Linux forks each worker from one fresh interpreter that imported torch and
the driver's ``__main__`` imports (``forkserver.SpawnedForkServer``), so only that server pays the
imports; ``PHALANX_START_METHOD=spawn``, and a fresh fork server that cannot start, give each
worker an interpreter of its own.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from phalanx._foundation import env
from phalanx.errors import ConfigError

logger = logging.getLogger(__name__)

FORK = "fork"
SPAWN = "spawn"
METHODS = (FORK, SPAWN)

_logged: set[str] = set()  # the reasons already logged in this process (each once)


@dataclass(frozen=True)
class StartMethod:
    name: str  # FORK or SPAWN
    reason: str  # why, for the log ("" for the default)
    # SPAWN only: fork each worker from one fresh interpreter (Linux, a fork-unsafe driver)
    fresh_fork_server: bool = False


def choose_start_method() -> StartMethod:
    """The start method for the next worker group; ConfigError if the requested one cannot work."""
    if not posix_supported():
        raise ConfigError(
            f"The local engine starts workers with POSIX process tools; this is {sys.platform}.\n"
            "HINT: run phalanx under WSL, or start Ray (ray.init()) to use the Ray engine."
        )
    requested = env.start_method()
    runtime = fork_unsafe_runtime()
    if requested is not None:
        return _requested(requested, runtime)
    if not fork_supported():
        return _chosen(SPAWN, f"the fork server needs Linux (this is {sys.platform})", debug=True)
    if runtime is not None:
        return _chosen(
            SPAWN,
            f"{runtime} is already initialised in this process and does not survive a fork: "
            "workers fork from a fresh interpreter that never initialised it and imports "
            f"torch and your __main__'s packages once ({env.START_METHOD_VAR}=spawn: a new "
            "interpreter per worker)",
            fresh_fork_server=True,
        )
    return StartMethod(FORK, "")


def _requested(requested: str, runtime: str | None) -> StartMethod:
    if requested not in METHODS:
        raise ConfigError(
            f"{env.START_METHOD_VAR}={requested!r} is not a start method: use one of {METHODS}.\n"
            f"HINT: set {env.START_METHOD_VAR}=spawn or fork, or unset it to let phalanx choose."
        )
    if requested == FORK and not fork_supported():
        raise ConfigError(
            f"{env.START_METHOD_VAR}=fork, but the fork server needs Linux (this is "
            f"{sys.platform}).\nHINT: unset {env.START_METHOD_VAR} (phalanx then spawns workers)."
        )
    if requested == FORK and runtime is not None:
        raise ConfigError(
            f"{env.START_METHOD_VAR}=fork, but {runtime} is already initialised in this "
            f"process: a forked worker cannot use it ({_FORK_ERRORS[runtime]}).\n"
            f"HINT: unset {env.START_METHOD_VAR} or set it to spawn (workers start as new "
            f"interpreters), or run fit() before the driver uses {runtime}."
        )
    return _chosen(requested, f"{env.START_METHOD_VAR}={requested}", debug=True)


def _chosen(
    name: str, reason: str, debug: bool = False, fresh_fork_server: bool = False
) -> StartMethod:
    if reason not in _logged:
        _logged.add(reason)
        level = logging.DEBUG if debug else logging.INFO
        logger.log(level, "Workers start with %s: %s.", name, reason)
    return StartMethod(name, reason, fresh_fork_server)


def posix_supported() -> bool:
    return os.name == "posix"


def fork_supported() -> bool:
    return sys.platform.startswith("linux")


# (runtime, module, its "already initialised?" function)
_RUNTIME_CHECKS = (
    ("CUDA", "torch.cuda", "is_initialized"),
    ("JAX", "jax._src.xla_bridge", "backends_are_initialized"),
    # A driver connected to Ray (ray.init) holds live gRPC connections to the cluster; forking
    # it mid-call can leave the *driver's* connection to the GCS wedged, so that its next
    # ray.nodes() never returns (gRPC is not fork-safe; seen in this project's test suite).
    ("Ray", "ray", "is_initialized"),
)
_FORK_ERRORS = {
    "CUDA": "'Cannot re-initialize CUDA in forked subprocess'",
    "JAX": "its backends and threads are not copied; jax.distributed cannot start",
    "Ray": "forking a process with live gRPC connections can wedge its connection to the GCS",
}


def fork_unsafe_runtime() -> str | None:
    """The name of a runtime this process has initialised that a forked child cannot use, or
    None. Imports nothing: a module the driver has not imported was not initialised."""
    for runtime, module, function in _RUNTIME_CHECKS:
        if _initialized(module, function):
            return runtime
    return None


def _initialized(module: str, function: str) -> bool:
    check = getattr(sys.modules.get(module), function, None)
    if check is None:
        return False
    try:
        return bool(check())
    except Exception:  # a half-imported library: be safe
        return True
