"""prepare_data_loader's exact resume on real local workers (TorchTrainer, gloo): after a failure,
and after a rerun on another number of workers, every id is trained exactly once per epoch, as
the "model" (which keeps the ids it was trained on, gathered from every rank like a gradient)
records it in its checkpoints."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

import phalanx as train
from phalanx.torch import TorchTrainer, prepare_data_loader

SIZE, BATCH, EPOCHS = 48, 4, 3

pytestmark = pytest.mark.slow


def _train_ids(config: dict[str, Any]) -> None:
    """Epochs over ids 0..SIZE-1, a report per step, a checkpoint every ``every`` steps (rank 0
    writes the model, the other ranks none); ``fail_at``: rank 1 raises at that global step in
    the first attempt; ``stop_at``: the function returns after that step (a run cut short)."""
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    seen: dict[str, list[int]] = {}
    start, step = 0, 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "model.json")) as f:
            saved = json.load(f)
        seen, start, step = saved["seen"], saved["epoch"], saved["step"]
    if config.get("iterable"):
        data: Any = _RankIds(rank, world)
        options = {}
    else:
        data, options = TensorDataset(torch.arange(SIZE)), {"shuffle": True}
    loader = prepare_data_loader(
        DataLoader(data, batch_size=BATCH, num_workers=config["num_workers"], **options)
    )
    for epoch in range(start, EPOCHS):
        if world > 1 and not config.get("iterable"):
            loader.sampler.set_epoch(epoch)  # Ray Train's loop
        for batch in loader:
            ids = batch if config.get("iterable") else batch[0]
            step += 1
            if step == config.get("fail_at") and ctx.get_attempt() == 0 and rank == 1:
                raise RuntimeError("injected failure")
            gathered: list[list[int]] = [[] for _ in range(world)]
            if world > 1:
                dist.all_gather_object(gathered, ids.tolist())
            else:
                gathered = [ids.tolist()]
            seen.setdefault(str(epoch), []).extend(i for part in gathered for i in part)
            _report(seen, epoch, step, rank, step % config["every"] == 0)
            if step == config.get("stop_at"):
                return
    _report(seen, EPOCHS, step, rank, True)  # the trained model


class _RankIds(IterableDataset):  # type: ignore[type-arg]
    """This rank's ids (rank, rank + world, ...), split over the loader's worker processes; the
    index of the next one is its state."""

    def __init__(self, rank: int, world: int) -> None:
        self.ids, self.next = list(range(rank, SIZE, world)), 0

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        while self.next < len(self.ids):
            index, self.next = self.next, self.next + 1
            if index % workers == worker:
                yield self.ids[index]
        self.next = 0  # the next pass is a new epoch

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


def _report(seen: dict[str, list[int]], epoch: int, step: int, rank: int, save: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if save and rank == 0:
            with open(os.path.join(d, "model.json"), "w") as f:
                json.dump({"seen": seen, "epoch": epoch, "step": step}, f)
            checkpoint = train.Checkpoint.from_directory(d)
        train.report({"epoch": epoch, "step": step}, checkpoint=checkpoint)


def _fit(storage: str, workers: int, config: dict[str, Any], **kwargs: Any) -> train.Result:
    return TorchTrainer(
        _train_ids,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=workers),
        run_config=train.RunConfig(
            storage_path=storage,
            failure_config=train.FailureConfig(max_failures=1),
            **kwargs,
        ),
    ).fit()


def _seen(result: train.Result) -> dict[str, list[int]]:
    assert result.error is None, result.error
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "model.json")) as f:
        return json.load(f)["seen"]


def _assert_each_id_once_per_epoch(seen: dict[str, list[int]]) -> None:
    assert sorted(seen) == [str(e) for e in range(EPOCHS)]
    for epoch, ids in seen.items():
        assert sorted(ids) == list(range(SIZE)), f"epoch {epoch}"


# 2 workers, 6 steps per epoch; a checkpoint every 4 steps: at step 8 (epoch 1, 2 of its 6
# steps) and step 12 (the end of epoch 1). Failing at step 10 resumes mid-epoch, at 14 after an
# epoch's last step (the loop restarts at that epoch: its first pass is empty).
@pytest.mark.parametrize(("fail_at", "num_workers"), [(10, 2), (14, 0)])
def test_a_failure_resumes_the_epoch_where_the_checkpoint_was(storage, fail_at, num_workers):
    config = {"every": 4, "fail_at": fail_at, "num_workers": num_workers}
    result = _fit(storage, 2, config)
    _assert_each_id_once_per_epoch(_seen(result))
    assert result.metrics["step"] == 18  # 3 epochs of 6 steps: the resumed epoch was short


def test_a_rerun_on_one_worker_continues_the_epoch_of_two(storage):
    first = _fit(storage, 2, {"every": 4, "stop_at": 8, "num_workers": 0}, name="two")
    assert first.checkpoint is not None
    second = TorchTrainer(
        _train_ids,
        train_loop_config={"every": 4, "num_workers": 0},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(storage_path=storage, name="one"),
        resume_from_checkpoint=first.checkpoint,
    ).fit()
    _assert_each_id_once_per_epoch(_seen(second))


def test_an_iterable_dataset_with_state_resumes_on_each_rank(storage):
    """Its own state, taken in each of the loader's worker processes by StatefulDataLoader."""
    config = {"every": 4, "fail_at": 10, "num_workers": 2, "iterable": True}
    result = _fit(storage, 2, config)
    _assert_each_id_once_per_epoch(_seen(result))
    assert result.metrics["step"] == 18
