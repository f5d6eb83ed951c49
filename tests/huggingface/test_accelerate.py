"""The Accelerate recipe (docs/guides/frameworks/huggingface.md): an ``Accelerator`` inside
``TorchTrainer``, ``accelerator.save_state`` checkpoints reported through phalanx and restored with
``load_state`` after a worker is killed. Real processes, 2 ranks, gloo."""

from __future__ import annotations

import json
import os
import signal
import tempfile

import pytest
import torch
import torch.nn.functional as F

# Imported here so the workers, forked from this process, start with it loaded.
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import phalanx
from phalanx import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from phalanx.torch import TorchTrainer

pytestmark = pytest.mark.slow

EPOCHS, KILL_AT = 4, 2


def _weights(model: torch.nn.Module) -> list[float]:
    return [round(float(p.detach().sum()), 6) for p in model.parameters()]


def _train_func(config):
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start, restored = 0, None
    if checkpoint := phalanx.get_checkpoint():
        with checkpoint.as_directory() as d:
            accelerator.load_state(d)
            with open(os.path.join(d, "epoch.json")) as f:
                start = json.load(f)["epoch"] + 1
        restored = _weights(model)

    ctx = phalanx.get_context()
    for epoch in range(start, EPOCHS):
        if epoch == KILL_AT and ctx.get_attempt() == 0 and ctx.get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
        metrics = {
            "epoch": epoch,
            "loss": loss.item(),
            "weights": _weights(model),
            "restored": restored,
            "processes": [accelerator.num_processes, accelerator.process_index],
        }
        with tempfile.TemporaryDirectory() as d:
            accelerator.save_state(d)  # rank 0: model, optimizer; every rank: its RNG state
            if accelerator.is_main_process:
                with open(os.path.join(d, "epoch.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
            phalanx.report(metrics, checkpoint=Checkpoint.from_directory(d))


def test_accelerate_recipe_saves_state_and_resumes_after_a_killed_worker(tmp_path):
    # The driver used Accelerate first (a notebook would): workers must not inherit its
    # single-process state, or every rank would train alone.
    assert Accelerator(cpu=True).num_processes == 1
    result = TorchTrainer(
        _train_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="accelerate",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()

    assert result.error is None and result.attempts == 2
    history = result.metrics_dataframe
    assert history["epoch"].tolist() == list(range(EPOCHS))  # resumed after epoch 1, not redone
    ranks = result.all_ranks_metrics_dataframe
    for _, row in ranks.iterrows():
        assert row["processes"] == [2, row["rank"]]  # a real 2-process Accelerate run
    last = ranks[ranks["epoch"] == EPOCHS - 1]
    assert last.iloc[0]["weights"] == last.iloc[1]["weights"]  # gradients were all-reduced
    saved = history.set_index("epoch")["weights"]
    resumed = history.set_index("epoch")["restored"]
    assert resumed[KILL_AT] == saved[KILL_AT - 1]  # load_state restored the saved model

    with result.checkpoint.as_directory() as d:
        names = set(os.listdir(d))
    assert {"model.safetensors", "optimizer.bin", "epoch.json"} <= names, names
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= names, names
