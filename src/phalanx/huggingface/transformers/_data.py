"""prepare_trainer: phalanx (and Ray Data) batch iterables as a Hugging Face ``Trainer``'s data.

``get_dataset_shard("train").iter_torch_batches(batch_size=8)`` yields ready batches (dicts of
tensors) and, like Ray's, starts a new pass over the shard each time it is iterated. HF's
``Trainer`` expects a dataset it batches itself; the prepared trainer instead wraps such an
iterable in an ``IterableDataset`` whose DataLoader hands each batch over as it is, once per
epoch. The shard is this rank's already, so the loader is not sharded again by Accelerate.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

import transformers
from torch.utils.data import DataLoader, Dataset, IterableDataset

from phalanx.data._iterator import Passes

__all__ = ["prepare_trainer"]

T = TypeVar("T")


def prepare_trainer(trainer: transformers.Trainer) -> transformers.Trainer:
    """Let ``trainer`` take phalanx batch iterables as its train, eval and test datasets.

    Returns the same object, its class swapped for a subclass (as Ray does) whose
    ``get_train_dataloader``, ``get_eval_dataloader`` and ``get_test_dataloader`` read an
    ``iter_torch_batches(...)`` / ``iter_batches(...)`` result batch by batch; any other dataset
    goes to HF's own loaders. Such data has no length: set ``TrainingArguments(max_steps=...)``.

    Example::

        shard = phalanx.get_dataset_shard("train")
        trainer = transformers.Trainer(
            model=model, args=transformers.TrainingArguments(output_dir="out", max_steps=100),
            train_dataset=shard.iter_torch_batches(batch_size=8),
        )
        trainer = prepare_trainer(trainer)
        trainer.train()
    """
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"prepare_trainer() takes a transformers.Trainer, got {type(trainer).__name__}.\n"
            "HINT: build the Trainer first, then pass it: trainer = prepare_trainer(trainer)."
        )
    _check_reusable("train_dataset", trainer.train_dataset)
    evals = trainer.eval_dataset
    for name, value in evals.items() if isinstance(evals, dict) else [("", evals)]:
        _check_reusable(f"eval_dataset[{name!r}]" if name else "eval_dataset", value)
    trainer.__class__ = _prepared_class(type(trainer))
    return trainer


def is_batch_iterable(data: object) -> bool:
    """A phalanx ``iter_*batches`` result, or Ray Data's (checked by name: Ray is not imported)."""
    if isinstance(data, Passes):
        return True
    cls = type(data)
    return cls.__name__ == "_IterableFromIterator" and cls.__module__.startswith("ray.data")


class BatchesDataset(IterableDataset[object]):
    """An ``IterableDataset`` over ready batches: every ``iter()`` is a new pass (epoch)."""

    def __init__(self, batches: Iterable[object]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[object]:
        return iter(self.batches)


def _batch_loader(batches: object) -> DataLoader[Any]:
    # batch_size=None: the items are batches already; the identity keeps them as they are
    dataset = BatchesDataset(cast("Iterable[object]", batches))  # is_batch_iterable said so
    return DataLoader(dataset, batch_size=None, collate_fn=_as_is)


def _as_is(batch: T) -> T:
    return batch


def _check_reusable(name: str, data: object) -> None:
    """A one-pass iterator would give HF's second epoch no rows: training would stop early."""
    if isinstance(data, Iterator) and not isinstance(data, (Dataset, Passes)):
        raise TypeError(
            f"prepare_trainer(): the Trainer's {name} is a one-pass iterator "
            f"({type(data).__name__}); the Trainer reads its data again every epoch, and the "
            "second pass would be empty.\nHINT: pass shard.iter_torch_batches(...) itself, not "
            "iter(...) of it nor a generator."
        )


_prepared: dict[type, type] = {}


def _prepared_class(base: type[transformers.Trainer]) -> type[transformers.Trainer]:
    """``base`` with loaders for batch iterables (one subclass per Trainer class)."""
    if base in _prepared.values():  # prepared already
        return base
    if base not in _prepared:
        _prepared[base] = _subclass(base)
    return _prepared[base]


@functools.cache
def _loaders_class() -> type[transformers.Trainer]:
    """The loaders for batch iterables, put in front of a Trainer class by :func:`_subclass`
    (``super()`` then reaches that class's own loaders). Made on first use: defining a
    Trainer subclass imports ``transformers.trainer``, seconds that an import of this module
    should not cost."""

    class _BatchIterableLoaders(transformers.Trainer):
        def get_train_dataloader(self) -> DataLoader[Any]:
            if is_batch_iterable(self.train_dataset):
                return _batch_loader(self.train_dataset)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader[Any]:
            data = eval_dataset if eval_dataset is not None else self.eval_dataset
            if isinstance(data, str) and isinstance(self.eval_dataset, dict):
                data = self.eval_dataset[data]
            if is_batch_iterable(data):
                return _batch_loader(data)
            return super().get_eval_dataloader(eval_dataset)

        def get_test_dataloader(self, test_dataset: Any) -> DataLoader[Any]:
            if is_batch_iterable(test_dataset):
                return _batch_loader(test_dataset)
            return super().get_test_dataloader(test_dataset)

    return _BatchIterableLoaders


def _subclass(base: type[transformers.Trainer]) -> type[transformers.Trainer]:
    """``RayTransformersTrainer``: a ``base`` that also reads phalanx batch iterables."""
    name = "RayTransformersTrainer"
    namespace = {"__module__": __name__, "__qualname__": name, "__doc__": _subclass.__doc__}
    return type(name, (_loaders_class(), base), namespace)
