"""phalanx: distributed training with Ray Train's API, on local processes or a Ray cluster.

``import phalanx as train`` gives what ``from ray import train`` gave.
"""

from phalanx._foundation import module_aliases as _module_aliases
from phalanx._version import __version__
from phalanx.backend import Backend, BackendConfig
from phalanx.callbacks import Callback, TrainRunContext, UserCallback
from phalanx.checkpoint import Checkpoint
from phalanx.config import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
    SyncConfig,
)
from phalanx.constants import TRAIN_DATASET_KEY
from phalanx.context import PreemptionInfo, TrainContext
from phalanx.errors import (
    ConfigError,
    ControllerError,
    HangError,
    NCCLHangError,
    PreemptionError,
    SessionMisuseError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
    WorkerStartupError,
)
from phalanx.reported_checkpoint import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)
from phalanx.result import Result
from phalanx.session import (
    CheckpointUploadMode,
    get_all_reported_checkpoints,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    get_preemption_info,
    report,
)
from phalanx.trainer import BaseTrainer, DataParallelTrainer
from phalanx.validation import ValidationConfig, ValidationFn, ValidationTaskConfig

_module_aliases.keep_moved_module_paths()  # old run directories' pickles name moved modules

__all__ = [
    "TRAIN_DATASET_KEY",
    "Backend",
    "BackendConfig",
    "BaseTrainer",
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ConfigError",
    "ControllerError",
    "DataConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "HangError",
    "LoggingConfig",
    "NCCLHangError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "SessionMisuseError",
    "StorageError",
    "SyncConfig",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerFailure",
    "WorkerGroupError",
    "WorkerStartupError",
    "__version__",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
