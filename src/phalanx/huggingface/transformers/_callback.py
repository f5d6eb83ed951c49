"""RayTrainReportCallback: every checkpoint a Hugging Face ``Trainer`` saves, reported to phalanx.

HF writes ``<output_dir>/checkpoint-<step>`` and keeps managing that folder (``save_total_limit``
rotates it, ``resume_from_checkpoint`` reads it). The callback never touches it: the files are
hard-linked into a private directory as ``checkpoint/`` (Ray's layout) and reported with
``SYNC``, which copies them into storage once. Where links are impossible (the temporary
directory is on another filesystem) they are copied into the private directory, which phalanx
then moves into storage (a rename when storage shares that filesystem). Ray always copies HF's
folder twice: into a temporary directory, then into storage.

Ranks that share one HF folder (same node, same ``output_dir``) report it once, after every rank
has finished saving: without that, a rank could copy files another rank is still writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

import phalanx.session as session
from phalanx.checkpoint import Checkpoint

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

logger = logging.getLogger(__name__)

__all__ = ["RayTrainReportCallback"]


class RayTrainReportCallback(transformers.TrainerCallback):
    """Report each checkpoint HF's ``Trainer`` saves, with the metrics logged so far.

    On every save, the metrics of ``state.log_history`` (merged, later values winning, as Ray
    does), plus ``step`` (the checkpoint's global step) and ``epoch``, are reported with the
    checkpoint, laid out as::

        checkpoint_000003/      the phalanx checkpoint
        └── checkpoint/         HF's checkpoint-<step> folder (model, optimizer, trainer state)

    Let evaluation run at every save (``eval_strategy == save_strategy``, and ``save_steps`` a
    multiple of ``eval_steps``) so the reported ``eval_*`` metrics belong to the checkpoint.

    Example::

        trainer = transformers.Trainer(model=model, args=args, train_dataset=...)
        trainer.add_callback(RayTrainReportCallback())
        trainer.train()
        # after fit(): load the model from result.checkpoint
        with result.checkpoint.as_directory() as d:
            model = AutoModelForSequenceClassification.from_pretrained(f"{d}/checkpoint")
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        """Report the checkpoint HF just saved (every rank reports: one phalanx round)."""
        metrics = _logged_metrics(state)
        folder = _saved_folder(args.output_dir, state.global_step)
        if folder is None or not _reports_folder(folder):
            session.report(metrics)
            return
        with _staged(folder, self.CHECKPOINT_NAME) as (staging, private_copy):
            session.report(
                metrics,
                checkpoint=Checkpoint.from_directory(staging),
                # our own copy may be moved into storage; hard links to HF's files may not
                delete_local_checkpoint_after_upload=private_copy,
            )


def _logged_metrics(state: TrainerState) -> dict[str, object]:
    metrics: dict[str, object] = {}
    for entry in state.log_history:
        metrics.update(entry)
    metrics["step"] = state.global_step  # the checkpoint's step, even when nothing was logged
    metrics["epoch"] = state.epoch
    return metrics


def _saved_folder(output_dir: str | None, step: int) -> str | None:
    """The folder HF saved at ``step`` (by name: an older run's folders in the same
    ``output_dir`` may have higher numbers, so the newest one is only a fallback)."""
    if output_dir is None:  # TrainingArguments allows it; HF saves nothing then
        return None
    folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    if os.path.isdir(folder):
        return folder
    if not os.path.isdir(output_dir):
        return None
    return get_last_checkpoint(output_dir)


def _reports_folder(folder: str) -> bool:
    """Whether this rank reports ``folder``: the lowest rank of each node sharing it does.

    The all-gather is also the barrier that makes every rank's files complete before any copy.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    key = (session.get_context().get_node_rank(), os.path.realpath(folder))
    keys: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(keys, key)
    return keys.index(key) == dist.get_rank()


@contextlib.contextmanager
def _staged(folder: str, name: str) -> Iterator[tuple[str, bool]]:
    """A private directory holding ``folder`` as ``name/``; yields it and whether every file in
    it is a private copy (none is a hard link to HF's files)."""
    staging = tempfile.mkdtemp(prefix="phalanx-hf-")
    linked: list[bool] = []

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
            linked.append(True)
        except OSError:  # another filesystem, or links not allowed
            shutil.copy2(src, dst)
            linked.append(False)

    try:
        shutil.copytree(folder, os.path.join(staging, name), copy_function=link_or_copy)
        yield staging, not any(linked)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
