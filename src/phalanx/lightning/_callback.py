"""RayTrainReportCallback: a Lightning checkpoint and the epoch's metrics, reported every epoch."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import phalanx.session as session
from phalanx.checkpoint import Checkpoint
from phalanx.lightning._flavour import import_lightning
from phalanx.session import CheckpointUploadMode

if TYPE_CHECKING:
    from phalanx.validation import ValidationTaskConfig

__all__ = ["RayTrainReportCallback"]

logger = logging.getLogger(__name__)

pl = import_lightning()


# Base classes of the Lightning flavour found at import: mypy sees a module object.
class RayTrainReportCallback(pl.callbacks.Callback):  # type: ignore[misc,name-defined]
    """At the end of every training epoch: save a Lightning checkpoint and report it with
    ``trainer.callback_metrics`` plus ``epoch`` and ``step`` (Lightning's ``global_step``).

    The committed checkpoint holds ``checkpoint.ckpt`` (:attr:`CHECKPOINT_NAME`), which
    ``trainer.fit(ckpt_path=...)`` resumes from. With DDP only rank 0 writes a file, so the other
    ranks report their metrics without a checkpoint; with sharded strategies every rank's part
    is saved and the parts merge into one checkpoint. Validation metrics logged in the epoch
    (``val_loss``) are in the report, so ``CheckpointConfig(checkpoint_score_attribute=
    "val_loss")`` keeps the best checkpoints.

    ``checkpoint_upload_mode``: as in :func:`phalanx.report` (``None`` means ``SYNC``).
    ``validation``: ``True`` or a ``phalanx.ValidationTaskConfig`` runs the trainer's
    ``validation_config`` function on each committed checkpoint, as :func:`phalanx.report` does
    (passed by the ranks that saved a part: rank 0 under DDP).

    Example::

        trainer = pl.Trainer(..., callbacks=[RayTrainReportCallback()])
        checkpoint = session.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.fit(model, loader, ckpt_path=os.path.join(d, "checkpoint.ckpt"))
        else:
            trainer.fit(model, loader)
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(
        self,
        checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
        validation: bool | ValidationTaskConfig = False,
    ) -> None:
        super().__init__()
        mode = (
            CheckpointUploadMode.SYNC if checkpoint_upload_mode is None else checkpoint_upload_mode
        )
        self.checkpoint_upload_mode = CheckpointUploadMode(mode)
        self.validation = validation
        ctx = session.get_context()
        # One private directory per callback: two runs (or two ranks) on a host never collide.
        self.tmpdir_prefix = tempfile.mkdtemp(
            prefix=f"phalanx-lightning-{ctx.get_experiment_name()}-rank{ctx.get_world_rank()}-"
        )

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics: dict[str, object] = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        tmpdir = os.path.join(self.tmpdir_prefix, str(trainer.current_epoch))
        os.makedirs(tmpdir, exist_ok=True)
        trainer.save_checkpoint(os.path.join(tmpdir, self.CHECKPOINT_NAME), weights_only=False)
        # Under DDP only rank 0 writes: the others' parts would be empty, so they report metrics.
        checkpoint = Checkpoint.from_directory(tmpdir) if os.listdir(tmpdir) else None
        session.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_upload_mode=self.checkpoint_upload_mode,
            validation=self.validation if checkpoint is not None else False,
        )
        trainer.strategy.barrier()
        if checkpoint is not None and self._upload_removes_directory():
            return  # phalanx moved the files aside already
        shutil.rmtree(tmpdir, ignore_errors=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            os.rmdir(self.tmpdir_prefix)  # only when empty: an ASYNC upload may still read it
        except OSError:
            pass

    def _upload_removes_directory(self) -> bool:
        return self.checkpoint_upload_mode.default_delete_local_checkpoint_after_upload()
