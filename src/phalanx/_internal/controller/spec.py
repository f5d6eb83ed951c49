"""RunSpec: what the trainer hands the controller, the same for every attempt of a run.

The controller does control only: what a run reads (datasets, DataConfig, a preprocessor) and
what it adds to checkpoints reach it as plain callables and bytes built by the trainer, so it
never imports a feature or framework package (``tests/test_layering.py`` keeps it that way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from phalanx._internal.storage.run_storage import RunStorage
from phalanx.backend import BackendConfig
from phalanx.callbacks import TrainRunContext
from phalanx.checkpoint import Checkpoint
from phalanx.config import RunConfig, ScalingConfig
from phalanx.validation import ValidationConfig


def no_shards(
    world_size: int, resume: Mapping[str, object] | None = None, peer: int | None = None
) -> list[dict[str, Any]]:
    """``RunSpec.make_shards`` of a run without datasets."""
    return [{} for _ in range(world_size)]


class DatasetPositions(Protocol):
    """What the trainer's datasets say about data positions (``data_position.py``), for the
    controller, which does not import the data package."""

    def combine(self, name: str, states: list[Any]) -> dict[str, Any]:
        """The record of dataset ``name`` from each rank's position state (None: the rank read
        nothing yet), for the shards of the current attempt."""
        ...

    def describe(self, name: str, record: dict[str, Any]) -> str:
        """``"dataset 'train' at epoch 3, sample 91,200 of 120,000"``."""
        ...

    def progress(self, name: str, record: dict[str, Any]) -> str:
        """``"train epoch 3 76%"``, for the progress view."""
        ...

    def first_report(self, index: int) -> None:
        """The attempt's first report is round ``index``: if it continues the round the shards
        made with ``make_shards(peer=round)`` start after, the ranks read those."""
        ...


class NoDatasetPositions:
    """``RunSpec.dataset_positions`` of a run without phalanx datasets."""

    def combine(self, name: str, states: list[Any]) -> dict[str, Any]:
        return {"world_size": len(states), "ranks": states}

    def describe(self, name: str, record: dict[str, Any]) -> str:
        return f"dataset {name!r}"

    def progress(self, name: str, record: dict[str, Any]) -> str:
        return name

    def first_report(self, index: int) -> None:
        pass


@dataclass(frozen=True)
class RunSpec:
    """Everything about the run that does not change between attempts."""

    train_fn_payload: bytes
    train_loop_config: dict[str, Any] | None
    backend_config: BackendConfig
    scaling_config: ScalingConfig
    run_config: RunConfig
    run_name: str
    metadata: dict[str, Any] = field(default_factory=dict)
    resume_from_checkpoint: Checkpoint | None = None
    # Each rank's dataset shards for a group of n ranks, called anew for every attempt (the
    # trainer's datasets, DataConfig and preprocessor live in it, not here); an attempt that
    # starts from a checkpoint passes resume= (dataset name -> its stored record, maybe empty);
    # peer=round: the shards that continue after that round, kept apart (``first_report``)
    make_shards: Callable[..., list[dict[str, Any]]] = no_shards
    dataset_positions: DatasetPositions = field(default_factory=NoDatasetPositions)
    resume_data_position: bool = True  # DataConfig(resume_position=False): start epochs over
    dataset_names: tuple[str, ...] = ()  # for run.json
    # Files added to every committed checkpoint (the fitted preprocessor), by file name
    checkpoint_files: dict[str, bytes] = field(default_factory=dict)
    start_timeout_s: float = 60.0
    validation_config: ValidationConfig | None = None
    train_fn: Callable[..., object] | None = None  # called as is when it runs in the driver
    total_rounds: int | None = None  # GBDT's num_boost_round, for the progress view


def run_context(spec: RunSpec, storage: RunStorage) -> TrainRunContext:
    """What callbacks are told about the run."""
    return TrainRunContext(
        spec.run_config,
        spec.train_loop_config,
        spec.scaling_config,
        spec.backend_config,
        storage.run_path,
        spec.run_name,
    )
