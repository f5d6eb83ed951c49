"""TrainContext: what a training worker knows about itself and its run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow.fs

__all__ = ["PreemptionInfo", "TrainContext"]


class RunLocation(Protocol):
    """Where a run's files live, as an engine sees them: ``filesystem`` (fsspec) and
    ``path(*parts)`` inside the run directory. The run's store provides it; the Ray engine has
    each worker on another node check it can reach the run before training starts."""

    @property
    def filesystem(self) -> Any: ...

    def path(self, *parts: str) -> str: ...


class StorageView(Protocol):
    """What ``TrainContext.get_storage()`` returns: the run's location with Ray's
    ``StorageContext`` names. The worker's ``StorageContext``
    (``_internal/worker/storage_context.py``) is the one implementation; it lives in a layer
    above this module, so the context names its surface here and mypy checks the match where
    the context is built."""

    @property
    def filesystem(self) -> Any: ...

    @property
    def storage_path(self) -> str: ...

    @property
    def storage_fs_path(self) -> str: ...

    @property
    def experiment_dir_name(self) -> str: ...

    @property
    def experiment_fs_path(self) -> str: ...

    @property
    def run_path(self) -> str: ...

    @property
    def trial_dir_name(self) -> str: ...

    @property
    def trial_fs_path(self) -> str: ...

    @property
    def checkpoint_manager_snapshot_path(self) -> str: ...

    @property
    def storage_filesystem(self) -> pyarrow.fs.FileSystem: ...

    def build_checkpoint_path_from_name(self, checkpoint_name: str) -> str: ...

    def extract_checkpoint_dir_name_from_path(self, checkpoint_path: str) -> str: ...

    def make_default_checkpoint_dir_name(self) -> str: ...


@dataclass(frozen=True)
class TrainContext:
    """Returned by :func:`phalanx.get_context` inside a training function.

    Ranks follow torchrun: ``world_rank`` is global, ``local_rank`` counts workers on the same
    node, ``node_rank`` counts nodes in the order their first worker appears.

    Example::

        ctx = phalanx.get_context()
        if ctx.get_world_rank() == 0:
            print("training on", ctx.get_world_size(), "workers")
    """

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    storage: StorageView = field(repr=False)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)
    gpu_ids: tuple[int, ...] = ()
    attempt: int = 0
    # This rank's dataset shards, set by its session (for get_data_position)
    dataset_shards: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_storage(self) -> StorageView:
        """Where the run lives, a ``StorageContext`` (Ray's names): ``storage_path``,
        ``experiment_dir_name``, ``experiment_fs_path``, ``filesystem`` (fsspec),
        ``storage_filesystem`` (pyarrow), ``build_checkpoint_path_from_name(name)``, ..."""
        return self.storage

    def get_metadata(self) -> dict[str, Any]:
        """The ``metadata`` dict given to the trainer."""
        return dict(self.metadata)

    def get_accelerator_ids(self) -> list[int]:
        """Physical GPU ids assigned to this worker (empty without GPUs)."""
        return list(self.gpu_ids)

    def get_attempt(self) -> int:
        """0 for the first attempt of the run, 1 after the first retry, ..."""
        return self.attempt

    def get_data_position(self, dataset_name: str | None = None) -> Any:
        """Where this rank is in ``get_dataset_shard(dataset_name)`` (the same default name): its
        ``position()``, a ``DataPosition`` (``epoch``, rows of the pass ``consumed``, ``rows``
        of the pass), for logging; None for a dataset that keeps no position (a
        ``ray.data.Dataset``). After a resume, before the first batch, ``epoch`` is the epoch
        the data continues. Not in Ray Train.

        Example::

            position = phalanx.get_context().get_data_position("train")
            print(f"epoch {position.epoch}: {position.consumed} of {position.rows} rows")
        """
        from phalanx.constants import TRAIN_DATASET_KEY
        from phalanx.errors import KeyNotFoundError

        shards = self.dataset_shards or {}
        name = dataset_name
        if name is None and shards:
            name = next(iter(shards)) if len(shards) == 1 else TRAIN_DATASET_KEY
        if name not in shards:
            raise KeyNotFoundError(
                f"get_data_position({dataset_name!r}): no dataset of that name; the trainer was "
                f"given {sorted(shards) or 'no datasets'}.\nHINT: pass one of those names."
            )
        position = getattr(shards[name], "position", None)
        return position() if callable(position) else None


@dataclass(frozen=True)
class PreemptionInfo:
    """A stop is coming: returned by :func:`phalanx.get_preemption_info` after a preemption notice.

    Every rank stops right after its ``report()`` of round ``stop_round`` (the same round on
    every rank, so a checkpoint passed in that round is committed); the run then restarts from
    the latest checkpoint. ``deadline`` (``time.time()``) is when the ranks are killed if they
    have not stopped. ``preempted_ranks`` got the SIGTERM.

    Example::

        for step in range(start, steps):
            ...
            preempting = phalanx.get_preemption_info() is not None
            checkpoint = save(model) if step % 1000 == 0 or preempting else None
            phalanx.report({"loss": loss}, checkpoint=checkpoint)
    """

    stop_round: int
    preempted_ranks: tuple[int, ...]
    deadline: float

    @property
    def deadline_ms(self) -> int:
        """``deadline`` in milliseconds since the epoch (Ray's field)."""
        return int(self.deadline * 1000)
