"""Pick the engine for a run: ScalingConfig.engine, else $PHALANX_ENGINE, else local processes."""

from __future__ import annotations

from phalanx._internal import env
from phalanx._internal.engines.base import Engine
from phalanx.config import ScalingConfig
from phalanx.errors import ConfigError


def resolve_engine(scaling_config: ScalingConfig) -> Engine:
    name = scaling_config.engine or env.engine_override() or "local"
    if name == "local":
        from phalanx._internal.engines.local import LocalProcessEngine

        return LocalProcessEngine()
    if name == "thread":
        from phalanx._internal.engines.thread import ThreadEngine

        return ThreadEngine()
    raise ConfigError(
        f"ScalingConfig(engine={name!r}) is not available in this version of phalanx "
        "(local and thread engines only).\nHINT: use engine='local'."
    )
