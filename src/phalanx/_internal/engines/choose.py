"""Pick the engine for a run.

``num_workers=0`` runs the training function in the caller's thread (Ray's local mode). Else,
in order: ``ScalingConfig(engine=...)``; else ``$PHALANX_ENGINE``; else Ray when the driver has
initialised Ray (``ray.init(...)`` before ``fit()``) or ``$RAY_ADDRESS`` names a cluster; else
local processes. Checking for Ray never imports it: only an already imported ``ray`` is asked.
"""

from __future__ import annotations

import sys

from phalanx._foundation import env
from phalanx._internal.engines.base import Engine
from phalanx.config import ScalingConfig
from phalanx.config._scaling import ENGINES
from phalanx.errors import ConfigError


def engine_name(scaling_config: ScalingConfig) -> str:
    """The name of the engine ``fit()`` will use for ``scaling_config``."""
    name = scaling_config.engine or env.engine_override()
    if name is not None:
        if name not in ENGINES:
            raise ConfigError(
                f"PHALANX_ENGINE={name!r} is invalid: it must be one of {', '.join(ENGINES)}."
            )
        return name
    return "ray" if ray_is_wanted() else "local"


def ray_is_wanted() -> bool:
    """Ray is initialised in this process, or RAY_ADDRESS points at a cluster."""
    if env.ray_address():
        return True
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)
    return bool(is_initialized is not None and is_initialized())


def resolve_engine(scaling_config: ScalingConfig) -> Engine:
    if scaling_config.num_workers == 0:  # Ray's local mode: run in the caller's thread
        from phalanx._internal.engines.inline import InlineEngine

        return InlineEngine()
    name = engine_name(scaling_config)
    if name == "ray":
        return _ray_engine()
    if name == "thread":
        from phalanx._internal.engines.thread import ThreadEngine

        return ThreadEngine()
    from phalanx._internal.engines.local.engine import LocalProcessEngine

    return LocalProcessEngine()


def _ray_engine() -> Engine:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "The Ray engine was chosen (ScalingConfig(engine='ray'), PHALANX_ENGINE=ray or "
            f"RAY_ADDRESS={env.ray_address()!r}) but Ray is not installed.\n"
            'HINT: pip install "phalanx[ray]", or unset RAY_ADDRESS / use engine="local".'
        ) from exc
    from phalanx._internal.engines.ray.engine import RayEngine

    return RayEngine()
