"""User configuration: ScalingConfig, RunConfig, FailureConfig, CheckpointConfig, DataConfig.

Names, fields and meaning follow Ray Train. Every config is a frozen dataclass validated at
construction: a bad value raises :class:`~phalanx.errors.ConfigError` naming the field, the value
and what is allowed, long before any worker starts.
"""

from phalanx.config._checkpoint import CheckpointConfig
from phalanx.config._data import DataConfig
from phalanx.config._failure import FailureConfig
from phalanx.config._run import LoggingConfig, RunConfig, SyncConfig
from phalanx.config._scaling import ScalingConfig

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "LoggingConfig",
    "RunConfig",
    "ScalingConfig",
    "SyncConfig",
]

# Each config family has its own module (with its validators); the classes keep this module as
# their home, so pickled trainers and reprs name phalanx.config.RunConfig, as before the split.
for _cls in (CheckpointConfig, DataConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig):
    _cls.__module__ = __name__
SyncConfig.__module__ = __name__
del _cls
