"""The API a training function calls: report, get_context, get_checkpoint, get_dataset_shard."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from phalanx._internal.worker.session import require_session
from phalanx.checkpoint import Checkpoint, CheckpointUploadMode
from phalanx.constants import TRAIN_DATASET_KEY
from phalanx.context import PreemptionInfo, TrainContext
from phalanx.errors import KeyNotFoundError
from phalanx.reported_checkpoint import CheckpointConsistencyMode, ReportedCheckpoint

if TYPE_CHECKING:
    from phalanx.validation import ValidationTaskConfig

__all__ = [
    "CheckpointUploadMode",
    "get_all_reported_checkpoints",
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
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: bool | ValidationTaskConfig = False,
) -> None:
    """Send ``metrics`` (and optionally a checkpoint) to the driver.

    Every rank must call ``report`` the same number of times: the k-th call of each rank forms
    round k, and rank 0's metrics are the run's. Without a checkpoint this never waits for the
    driver. The checkpoint is committed once every rank that passed one in this round has saved
    its part; the parts merge into one directory. A missing directory is an error; an empty
    one is a checkpoint, as in Ray.

    The directory you pass is yours (as in Ray Train). ``checkpoint_upload_mode``:

    - ``SYNC`` (default): its files are copied into storage before ``report()`` returns (a
      reflink or in-kernel copy where the filesystem has one); the directory is left as it was.
    - ``ASYNC``: ``report()`` returns at once and the part is saved by a background thread
      (commits stay in order; the next checkpoint waits for this one; the end of training
      waits for all).
    - ``NO_UPLOAD``: the checkpoint was written in place, at
      ``get_context().get_storage().build_checkpoint_path_from_name(name)``; other ranks of
      the round pass the same ``checkpoint_dir_name`` and their parts join it (without one,
      use ``get_storage().make_default_checkpoint_dir_name()`` as the name).

    ``delete_local_checkpoint_after_upload`` (default: True for ``ASYNC``, False otherwise):
    True lets phalanx move your files (a rename on the same filesystem, no copy) and remove the
    directory once they are safe; ``ASYNC`` moves them aside at once, so the directory is free
    when ``report()`` returns (a ``tempfile.TemporaryDirectory`` is fine). With ``ASYNC`` and
    False the directory is read in the background, as in Ray: keep it unchanged and in place
    until the upload completes (use ``tempfile.mkdtemp()``, not a ``TemporaryDirectory``); the
    next ``report()`` with a checkpoint returns only after it, and so does the training
    function.
    ``checkpoint_dir_name``: one plain directory name (default ``checkpoint_<round>``).
    ``checkpoint_upload_fn(checkpoint, checkpoint_dir_name)``: your own upload (e.g. torch's
    distributed checkpointing): it writes the files, typically to
    ``get_context().get_storage().build_checkpoint_path_from_name(checkpoint_dir_name)``, and
    returns that ``Checkpoint``; one saved elsewhere is copied into the run. It runs before
    ``report`` returns, whatever the upload mode.
    ``validation``: ``True`` or a :class:`~phalanx.ValidationTaskConfig` runs the trainer's
    ``validation_config`` function on this checkpoint once it is committed, in the background.

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
        checkpoint_upload_fn,
        validation,
    )


def get_context() -> TrainContext:
    """This worker's ranks, world size, experiment name and storage.

    Example::

        context = phalanx.get_context()
        if context.get_world_rank() == 0:
            print(f"{context.get_world_size()} workers")
    """
    return require_session("get_context").context


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint when this worker started (after a retry or a resume), or
    the last checkpoint this worker reported since; None on a fresh run.

    Example::

        if checkpoint := phalanx.get_checkpoint():
            with checkpoint.as_directory() as d:
                model.load_state_dict(torch.load(f"{d}/model.pt"))
    """
    return require_session("get_checkpoint").current_checkpoint()


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's shard of ``datasets[dataset_name]`` given to the trainer.

    Without a name: the only dataset, or ``"train"`` when there are several; None when the
    trainer was given no datasets.

    Example::

        shard = phalanx.get_dataset_shard("train")
        for batch in shard.iter_torch_batches(batch_size=64):
            ...
    """
    session = require_session("get_dataset_shard")
    session.shards_taken = True
    shards = session.dataset_shards
    name = dataset_name
    if name is None:
        if not shards:
            return None
        name = next(iter(shards)) if len(shards) == 1 else TRAIN_DATASET_KEY
    if name not in shards:
        raise KeyNotFoundError(_no_dataset_message(name, sorted(shards)))
    return shards[name]


def _no_dataset_message(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    hint = (
        f"did you mean {close[0]!r}?"
        if close
        else "pass it as Trainer(datasets={" + repr(name) + ": ...})."
    )
    return (
        f"No dataset named {name!r}; the trainer was given {names or 'no datasets'}.\nHINT: {hint}"
    )


def get_preemption_info() -> PreemptionInfo | None:
    """None, or a notice that a worker of this run was preempted (SIGTERM) and every rank will
    stop right after its ``report()`` of round ``stop_round``: save a checkpoint before then.

    A cheap attribute read: call it every step.

    Example::

        checkpoint = None
        if phalanx.get_preemption_info() is not None:  # every rank stops after round stop_round
            checkpoint = save(model)
        phalanx.report(metrics, checkpoint=checkpoint)
    """
    return require_session("get_preemption_info").preemption


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """Every checkpoint of this run still kept, oldest first, with its metrics and status.

    Waits, as Ray does, until every report this rank made is processed: each of those rounds
    reported by every rank and its checkpoint (whichever rank passed it) committed; with
    ``VALIDATED`` also until every requested validation has finished. At most ``timeout_s``
    seconds (None: no limit); then raises TimeoutError.

    Example::

        phalanx.report({"loss": loss}, checkpoint=ckpt)
        best = min(phalanx.get_all_reported_checkpoints(), key=lambda r: r.metrics["loss"])
    """
    from phalanx._internal.worker.reported import reported_checkpoints

    session = require_session("get_all_reported_checkpoints")
    return reported_checkpoints(session, CheckpointConsistencyMode(consistency_mode), timeout_s)
