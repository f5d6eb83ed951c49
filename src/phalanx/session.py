"""The API a training function calls: report, get_context, get_checkpoint, get_dataset_shard."""

from __future__ import annotations

from typing import Any

from phalanx._internal.worker.session import require_session
from phalanx._internal.worker.uploader import CheckpointUploadMode
from phalanx.checkpoint import Checkpoint
from phalanx.context import PreemptionInfo, TrainContext

__all__ = [
    "CheckpointUploadMode",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
) -> None:
    """Send ``metrics`` (and optionally a checkpoint) to the driver.

    Every rank must call ``report`` the same number of times: the k-th call of each rank forms
    round k, and rank 0's metrics are the run's. Without a checkpoint this never waits for the
    driver. With one, this rank's files are moved (same filesystem) or copied into the run's
    storage before it returns; the checkpoint is committed once every rank that passed one in
    this round has saved its part. The directory you pass is emptied when its files are moved.

    ``checkpoint_upload_mode``: ``SYNC`` (default) persists this rank's part before returning;
    ``ASYNC`` moves the files aside (a rename) and returns at once, persisting in a background
    thread (commits stay in order; the next checkpoint waits for this one; the end of training
    waits for all); ``NO_UPLOAD`` takes a checkpoint written directly inside the run directory.
    ``delete_local_checkpoint_after_upload``: remove your directory after a SYNC copy to remote
    storage (ASYNC always cleans up its private copy).

    Example::

        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            phalanx.report({"loss": loss}, checkpoint=phalanx.Checkpoint.from_directory(d))
    """
    require_session("report").report(
        metrics,
        checkpoint,
        checkpoint_dir_name,
        checkpoint_upload_mode,
        delete_local_checkpoint_after_upload,
    )


def get_context() -> TrainContext:
    """This worker's ranks, world size, experiment name and storage."""
    return require_session("get_context").context


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint when this worker started (after a retry or a resume), or
    the last checkpoint this worker reported since; None on a fresh run."""
    return require_session("get_checkpoint").latest_checkpoint


def get_dataset_shard(name: str) -> Any:
    """This worker's shard of ``datasets[name]`` given to the trainer."""
    shards = require_session("get_dataset_shard").dataset_shards
    if name not in shards:
        raise KeyError(
            f"No dataset named {name!r}; the trainer was given {sorted(shards) or 'no datasets'}."
            "\nHINT: pass it as Trainer(datasets={" + repr(name) + ": ...})."
        )
    return shards[name]


def get_preemption_info() -> PreemptionInfo | None:
    """None, or a notice that a worker of this run was preempted (SIGTERM) and every rank will
    stop right after its ``report()`` of round ``stop_round``: save a checkpoint before then.

    A cheap attribute read: call it every step.
    """
    return require_session("get_preemption_info").preemption
