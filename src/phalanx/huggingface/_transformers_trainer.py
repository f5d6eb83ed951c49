"""TransformersTrainer: AIR's trainer around a Hugging Face ``transformers.Trainer`` (deprecated).

Ray 2.5-2.7 shipped it; Ray 2.8 removed it in favour of ``TorchTrainer`` with
``prepare_trainer`` and ``RayTrainReportCallback``. This class is that modern form built for the
user: it keeps old scripts running and says, once, what to write instead.

Per worker (what AIR did):

1. the ``"train"`` shard becomes a torch ``IterableDataset`` of rows (tensors) with a length, so
   ``num_train_epochs`` works; HF batches it with the Trainer's own collator and does not split
   it again (it is this rank's share already);
2. the ``"evaluation"`` dataset (not split across ranks) becomes a map-style dataset: HF shares
   evaluation between the ranks itself and gathers the metrics;
3. ``trainer_init_per_worker(train_dataset, eval_dataset, **trainer_init_config)`` returns the
   ``transformers.Trainer``; its reporting integrations (``report_to``) are removed, as AIR did;
4. every HF log is reported as a phalanx round, and every HF save as a round with the checkpoint
   (HF's ``checkpoint-N`` folder under ``checkpoint/``, Ray's modern layout);
5. a retry or a resumed run restarts HF from the latest checkpoint
   (``trainer.train(resume_from_checkpoint=...)``): HF's step count, optimizer and RNG state go on.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import transformers
from torch.utils.data import DataLoader, Dataset, IterableDataset

import phalanx.session as session
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.huggingface.transformers._callback import RayTrainReportCallback
from phalanx.huggingface.transformers._data import prepare_trainer
from phalanx.torch import TorchConfig, TorchTrainer

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from phalanx.data import DataIterator

Row = dict[str, torch.Tensor]

logger = logging.getLogger(__name__)

__all__ = ["TransformersTrainer"]

TRAIN, EVALUATION = "train", "evaluation"

DEPRECATION = (
    "TransformersTrainer is deprecated: Ray removed it in 2.8 in favour of TorchTrainer with "
    "the Transformers helpers. The modern form:\n"
    "    def train_func(config): trainer = prepare_trainer(trainer_init_per_worker(train_ds, "
    "eval_ds, **config)); trainer.add_callback(RayTrainReportCallback()); trainer.train()\n"
    "    TorchTrainer(train_func, train_loop_config=trainer_init_config, "
    "scaling_config=scaling_config, datasets=datasets).fit()\n"
    "(from phalanx.huggingface.transformers import RayTrainReportCallback, prepare_trainer; "
    'train_ds = phalanx.get_dataset_shard("train").iter_torch_batches(batch_size=...))'
)


class TransformersTrainer(TorchTrainer):
    """AIR's ``TransformersTrainer`` (deprecated): runs ``transformers.Trainer.train()`` on every
    worker, the ``transformers.Trainer`` made by ``trainer_init_per_worker``.

    ``trainer_init_per_worker(train_dataset, eval_dataset, **trainer_init_config)`` receives
    this rank's share of ``datasets["train"]`` and the whole ``datasets["evaluation"]`` as torch
    datasets (None for a missing one) and returns the Trainer. Metrics are reported at every HF
    log, checkpoints at every HF save (``<checkpoint>/checkpoint/`` holds HF's folder). Unlike
    AIR, the logging, evaluation and save strategies need not match: each checkpoint is
    reported with every metric logged up to it.

    Example::

        def trainer_init_per_worker(train_dataset, eval_dataset, **config):
            args = transformers.TrainingArguments(output_dir="out", num_train_epochs=2,
                                                  eval_strategy="epoch", save_strategy="epoch",
                                                  report_to="none")
            return transformers.Trainer(model=make_model(), args=args,
                                        train_dataset=train_dataset, eval_dataset=eval_dataset)

        result = TransformersTrainer(
            trainer_init_per_worker,
            scaling_config=phalanx.ScalingConfig(num_workers=2),
            datasets={"train": train_ds, "evaluation": eval_ds},
        ).fit()
    """

    def __init__(
        self,
        trainer_init_per_worker: Callable[..., transformers.Trainer],
        *,
        trainer_init_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        preprocessor: object = None,
    ) -> None:
        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        _check_init_function(trainer_init_per_worker)
        super().__init__(
            functools.partial(_train_loop_per_worker, trainer_init_per_worker),
            train_loop_config=dict(trainer_init_config or {}),
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            # The evaluation set goes whole to every rank, as AIR did: HF shares it out itself.
            dataset_config=dataset_config or DataConfig(datasets_to_split=[TRAIN]),
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
        )


def _check_init_function(fn: object) -> None:
    if not callable(fn):
        raise ConfigError(
            f"trainer_init_per_worker={fn!r} is invalid: it must be a function that returns a "
            "transformers.Trainer.\nHINT: def trainer_init_per_worker(train_dataset, "
            "eval_dataset, **config): return transformers.Trainer(...)"
        )
    if len(inspect.signature(fn).parameters) < 3:
        raise ConfigError(
            f"trainer_init_per_worker {getattr(fn, '__name__', fn)!r} takes fewer than 3 "
            "arguments; it is called with the train dataset, the evaluation dataset, then the "
            "trainer_init_config as keyword arguments.\n"
            "HINT: def trainer_init_per_worker(train_dataset, eval_dataset, **config): ..."
        )


# -- in the worker --------------------------------------------------------------------------------


def _train_loop_per_worker(
    trainer_init_per_worker: Callable[..., transformers.Trainer], config: dict[str, object]
) -> None:
    train_shard, eval_shard = _shard(TRAIN), _shard(EVALUATION)
    train_data = ShardRows(train_shard) if train_shard is not None else None
    eval_data = _all_rows(eval_shard) if eval_shard is not None else None
    trainer = trainer_init_per_worker(train_data, eval_data, **config)
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"trainer_init_per_worker returned {type(trainer).__name__}, not a "
            "transformers.Trainer.\nHINT: end it with return transformers.Trainer(...)."
        )
    for callback in transformers.trainer.get_reporting_integration_callbacks(
        trainer.args.report_to
    ):
        trainer.pop_callback(callback)  # phalanx reports; AIR removed these too
    trainer = _with_shard_loader(prepare_trainer(trainer))
    trainer.add_callback(AirReportCallback())
    checkpoint = session.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as d:
        trainer.train(
            resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        )


def _shard(name: str) -> DataIterator | None:
    try:
        return session.get_dataset_shard(name)
    except KeyError:
        return None


def _tensor_rows(shard: DataIterator) -> Iterator[Row]:
    for batch in shard.iter_batches(batch_format="numpy"):
        # a copy: the batch's arrays are read-only views of the shard's blocks
        tensors = {c: torch.tensor(values) for c, values in batch.items()}
        for i in range(len(next(iter(tensors.values()))) if tensors else 0):
            yield {c: t[i] for c, t in tensors.items()}


class ShardRows(IterableDataset[Row]):
    """This rank's shard as rows of tensors; every ``iter()`` reads it again (one epoch).

    The length is the shard's row count, the same on every rank (phalanx splits equally), so HF
    computes the same number of steps per epoch everywhere.
    """

    def __init__(self, shard: DataIterator) -> None:
        super().__init__()
        self.shard = shard

    def __len__(self) -> int:
        return int(self.shard.count())

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return _tensor_rows(self.shard)


class _Rows(Dataset[Row]):
    def __init__(self, rows: list[dict[str, torch.Tensor]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def _all_rows(shard: DataIterator) -> _Rows:
    return _Rows(list(_tensor_rows(shard)))


_shard_loader_classes: dict[type, type] = {}


@functools.cache
def _shard_loader() -> type[transformers.Trainer]:
    """The train loader put in front of a Trainer class by :func:`_with_shard_loader`
    (``super()`` then reaches that class's own loader): a :class:`ShardRows` is batched as it
    is, not split again. Made on first use, as prepare_trainer's loaders are."""

    class _ShardLoader(transformers.Trainer):
        def get_train_dataloader(self) -> DataLoader[Row]:
            if not isinstance(self.train_dataset, ShardRows):
                return super().get_train_dataloader()
            collate = self._get_collator_with_removed_columns(self.data_collator, "training")
            return DataLoader(
                self.train_dataset,
                batch_size=self._train_batch_size,
                collate_fn=collate,
                drop_last=self.args.dataloader_drop_last,
            )

    return _ShardLoader


def _with_shard_loader(trainer: transformers.Trainer) -> transformers.Trainer:
    """``trainer`` whose train loader batches a :class:`ShardRows` without splitting it again."""
    base = type(trainer)
    if base not in _shard_loader_classes:
        name = "AirTransformersTrainer"
        namespace = {"__module__": __name__, "__qualname__": name}
        _shard_loader_classes[base] = type(name, (_shard_loader(), base), namespace)
    trainer.__class__ = _shard_loader_classes[base]
    return trainer


class AirReportCallback(RayTrainReportCallback):
    """AIR's reporting: each HF log is a round; a save is a round with the checkpoint (and every
    metric logged so far). Logs are held until the step ends, so a save in the same step takes
    them with its checkpoint instead of making a round of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[str, object] = {}
        self.last: dict[str, object] = {}

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        self.pending.update({**(logs or {}), "step": state.global_step, "epoch": state.epoch})

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        self.last = {**self.last, **self.pending}
        self.pending = {}
        super().on_save(args, state, control, **kwargs)

    def on_step_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        self._flush()

    def on_epoch_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        self._flush()

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        if self.pending:  # HF's closing summary, with the last eval metrics as AIR reported
            self.pending = {**self.last, **self.pending}
        self._flush()

    def _flush(self) -> None:
        if self.pending:
            session.report(self.pending)
            self.last = {**self.last, **self.pending}
            self.pending = {}
