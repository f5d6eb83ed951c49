"""How the local engine starts its workers: ``fork`` (a fork server) or ``spawn`` (fresh
interpreters).

``fork`` is the fast path: a copy of the driver forks each worker, which already holds every
module the driver imported. It needs Linux (``SOCK_SEQPACKET`` for ``AF_UNIX``, ``prctl``) and a
driver that is safe to copy. ``spawn`` starts each worker as a new Python interpreter: it works on
every POSIX platform and after the driver initialised a runtime that does not survive a fork
(CUDA: "Cannot re-initialize CUDA in forked subprocess"), at the cost of re-importing.

Chosen in this order: ``PHALANX_START_METHOD``, then ``spawn`` off Linux, then ``spawn`` when
the driver has initialised CUDA, else ``fork``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from phalanx._internal import env
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


def choose_start_method() -> StartMethod:
    """The start method for the next worker group; ConfigError if the requested one cannot work."""
    requested = env.start_method()
    cuda = _cuda_initialized()
    if requested is not None:
        return _requested(requested, cuda)
    if not fork_supported():
        return _chosen(SPAWN, f"the fork server needs Linux (this is {sys.platform})", debug=True)
    if cuda:
        return _chosen(
            SPAWN,
            "CUDA is already initialised in this process and does not survive a fork: "
            "workers start as new interpreters (slower to start; "
            f"set {env.START_METHOD_VAR}=spawn to say so and silence this)",
        )
    return StartMethod(FORK, "")


def _requested(requested: str, cuda: bool) -> StartMethod:
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
    if requested == FORK and cuda:
        raise ConfigError(
            f"{env.START_METHOD_VAR}=fork, but CUDA is already initialised in this process: "
            "a forked worker cannot use CUDA ('Cannot re-initialize CUDA in forked "
            f"subprocess').\nHINT: unset {env.START_METHOD_VAR} or set it to spawn (workers "
            "start as new interpreters), or run fit() before the driver touches the GPU."
        )
    return _chosen(requested, f"{env.START_METHOD_VAR}={requested}", debug=True)


def _chosen(name: str, reason: str, debug: bool = False) -> StartMethod:
    if reason not in _logged:
        _logged.add(reason)
        level = logging.DEBUG if debug else logging.INFO
        logger.log(level, "Workers start with %s: %s.", name, reason)
    return StartMethod(name, reason)


def fork_supported() -> bool:
    return sys.platform.startswith("linux")


def _cuda_initialized() -> bool:
    """Whether this process has initialised CUDA through torch. Never imports torch: a driver that
    has not imported it cannot have initialised CUDA with it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if is_initialized is None:
        return False
    try:
        return bool(is_initialized())
    except Exception:  # a half-imported torch: be safe
        return True
