"""AIR's deprecated ``AccelerateTrainer``: its configuration becomes what ``accelerate launch``
would set, and the AIR docstring example (a small regression net, ``Accelerator()`` in a loop
without arguments, a "train" dataset) runs on 2 real workers with a file written like
``accelerate config``'s, resuming from its last checkpoint after a worker is killed."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest
import torch
import torch.nn as nn
import yaml

# Imported here so the workers, forked from this process, start with it loaded.
from accelerate import Accelerator

import phalanx
import phalanx.data
from phalanx import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.huggingface import AccelerateTrainer
from phalanx.huggingface._accelerate_trainer import launch_environment, load_accelerate_config

NUM_EPOCHS, KILL_AT = 6, 3


def test_deprecation_warning_shows_the_modern_form():
    with pytest.warns(DeprecationWarning, match="AccelerateTrainer is deprecated") as caught:
        AccelerateTrainer(lambda: None, accelerate_config={})
    message = str(caught[0].message)
    assert "def train_func(config): accelerator = Accelerator(mixed_precision=" in message
    assert "TorchTrainer(train_func, train_loop_config=train_loop_config" in message
    assert caught[0].filename == __file__


def test_config_becomes_what_accelerate_launch_sets_less_the_cluster(tmp_path):
    written = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "mixed_precision": "fp16",
        "gradient_accumulation_steps": 4,
        "num_machines": 3,
        "num_processes": 24,
        "machine_rank": 1,
        "main_process_ip": "10.0.0.1",
        "use_cpu": False,
        "dynamo_config": {"dynamo_backend": "inductor", "dynamo_mode": "max-autotune"},
    }
    path = tmp_path / "default_config.yaml"
    path.write_text(yaml.safe_dump(written))
    assert load_accelerate_config(str(path)) == written
    assert launch_environment(load_accelerate_config(path)) == {
        "ACCELERATE_MIXED_PRECISION": "fp16",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4",
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
        "ACCELERATE_DYNAMO_MODE": "max-autotune",
    }
    with pytest.raises(ConfigError, match=r"DEEPSPEED(.|\n)*HINT: pass the plugin"):
        launch_environment({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero": 2}})
    with pytest.raises(ConfigError, match="mixed_precision"):
        launch_environment({"mixed_precision": "fp12"})
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="existing file"):
        AccelerateTrainer(lambda: None, accelerate_config=str(tmp_path / "missing.yaml"))


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(1, 32)
        self.relu = nn.ReLU()
        self.layer2 = nn.Linear(32, 1)

    def forward(self, input):
        return self.layer2(self.relu(self.layer1(input)))


def train_loop_per_worker():
    # The AIR docstring's loop (session.* -> phalanx.*), with a checkpoint it resumes from.
    accelerator = Accelerator()
    dataset_shard = phalanx.get_dataset_shard("train")
    torch.manual_seed(0)
    model = NeuralNetwork()
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    if checkpoint := phalanx.get_checkpoint():
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        accelerator.unwrap_model(model).load_state_dict(state["model"])
        start = state["epoch"] + 1
    ctx = phalanx.get_context()
    for epoch in range(start, NUM_EPOCHS):
        if (ctx.get_attempt(), ctx.get_world_rank(), epoch) == (0, 1, KILL_AT):
            os.kill(os.getpid(), signal.SIGKILL)
        for batches in dataset_shard.iter_torch_batches(batch_size=8, dtypes=torch.float):
            inputs, labels = torch.unsqueeze(batches["x"], 1), batches["y"]
            with accelerator.accumulate(model):
                loss = loss_fn(model(inputs).squeeze(), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        metrics = {
            "loss": loss.item(),
            "epoch": epoch,
            "mixed_precision": accelerator.mixed_precision,
            "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
            "num_processes": accelerator.num_processes,
        }
        with tempfile.TemporaryDirectory() as d:
            state = {"epoch": epoch, "model": accelerator.unwrap_model(model).state_dict()}
            torch.save(state, os.path.join(d, "state.pt"))
            phalanx.report(metrics, checkpoint=Checkpoint.from_directory(d))


@pytest.mark.slow
def test_air_docstring_example_applies_the_config_and_resumes_after_a_killed_worker(tmp_path):
    config_file = tmp_path / "default_config.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "MULTI_CPU",
                "num_processes": 8,  # ignored: ScalingConfig decides
                "mixed_precision": "bf16",
                "gradient_accumulation_steps": 2,
            }
        )
    )
    items = [{"x": x / 64, "y": 2 * x / 64 + 1} for x in range(64)]
    with pytest.warns(DeprecationWarning):
        trainer = AccelerateTrainer(
            train_loop_per_worker=train_loop_per_worker,
            accelerate_config=str(config_file),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="air_accelerate",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
            ),
            datasets={"train": phalanx.data.from_items(items)},
        )
    result = trainer.fit()

    assert result.error is None and result.attempts == 2
    # Every epoch reported once: the retry went on from the checkpoint of epoch KILL_AT - 1.
    assert result.metrics_dataframe["epoch"].tolist() == list(range(NUM_EPOCHS))
    # The file's settings reached every worker's Accelerator; its num_processes did not.
    assert result.metrics["mixed_precision"] == "bf16"
    assert result.metrics["gradient_accumulation_steps"] == 2
    assert result.metrics["num_processes"] == 2
