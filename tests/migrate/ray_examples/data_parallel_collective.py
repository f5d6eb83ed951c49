# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Saving and Loading Checkpoints" (doc/source/train/doc_code/checkpoints.py:
# CheckpointConfig with a score) and the ray.train.collective utilities, with
# `from ray import train` as the AIR-to-V2 migration guide writes it, in Ray's own form.
# Synthetic: a counter as the "model", 2 workers, 4 steps.
import json
import os
import tempfile

from ray import train
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.data_parallel_trainer import DataParallelTrainer
import ray.train.collective


def train_func(config):
    # Rank 0 decides, every rank gets the same value.
    seed = ray.train.collective.broadcast_from_rank_zero(
        {"seed": 7} if train.get_context().get_world_rank() == 0 else None
    )
    for step in range(config["steps"]):
        loss = 1.0 / (step + seed["seed"])
        with tempfile.TemporaryDirectory() as tmpdir:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(tmpdir, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
                checkpoint = Checkpoint.from_directory(tmpdir)
            ray.train.collective.barrier()
            train.report({"loss": loss, "step": step}, checkpoint=checkpoint)


trainer = DataParallelTrainer(
    train_func,
    train_loop_config={"steps": 4},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(
        name="collective",
        checkpoint_config=CheckpointConfig(
            num_to_keep=2,
            checkpoint_score_attribute="loss",
            checkpoint_score_order="min",
        ),
    ),
)
result = trainer.fit()

assert result.metrics["step"] == 3
assert len(result.best_checkpoints) == 2
with result.checkpoint.as_directory() as checkpoint_dir:
    with open(os.path.join(checkpoint_dir, "state.json")) as f:
        assert json.load(f) == {"step": 3}
print("ROUNDTRIP-OK")
