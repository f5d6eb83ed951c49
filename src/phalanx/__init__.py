"""phalanx: distributed training with Ray Train's API, on local processes or a Ray cluster.

``import phalanx as train`` gives what ``from ray import train`` gave.
"""

from phalanx.backend import Backend, BackendConfig
from phalanx.callbacks import Callback, TrainRunContext, UserCallback
from phalanx.checkpoint import Checkpoint
from phalanx.config import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx.context import PreemptionInfo, TrainContext
from phalanx.errors import (
    ConfigError,
    ControllerError,
    HangError,
    PreemptionError,
    ReportMismatchError,
    SessionMisuseError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerGroupError,
)
from phalanx.result import Result
from phalanx.session import (
    CheckpointUploadMode,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    get_preemption_info,
    report,
)
from phalanx.trainer import BaseTrainer, DataParallelTrainer

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendConfig",
    "BaseTrainer",
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointUploadMode",
    "ConfigError",
    "ControllerError",
    "DataConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "HangError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportMismatchError",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "SessionMisuseError",
    "StorageError",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "WorkerFailure",
    "WorkerGroupError",
    "__version__",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
