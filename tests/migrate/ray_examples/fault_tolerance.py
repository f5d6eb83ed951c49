# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Handling Failures and Node Preemption"
# (doc/source/train/doc_code/fault_tolerance.py: worker fault tolerance and the just-in-time
# checkpoint on preemption), in Ray's own form. Synthetic: 2 workers, 3 steps, and rank 0 fails
# once after the first checkpoint so that the retry restores from it.
import os

os.environ["RAY_TRAIN_V2_ENABLED"] = "1"

import tempfile
import uuid

import torch

import ray.train
import ray.train.torch

# Tries to recover a run up to this many times.
failure_config = ray.train.FailureConfig(max_failures=2)

FAILED_ONCE = os.path.join(tempfile.gettempdir(), f"failed-once-{os.getpid()}")


def save_checkpoint(model: torch.nn.Module, step: int):
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        checkpoint = None
        # Save the checkpoint from rank 0, which holds a full model replica.
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(
                {"model": model.state_dict(), "step": step},
                os.path.join(temp_checkpoint_dir, "checkpoint.pt"),
            )
            checkpoint = ray.train.Checkpoint.from_directory(temp_checkpoint_dir)
        # Call `report` on every rank, with or without a checkpoint.
        ray.train.report({"step": step}, checkpoint=checkpoint)


def train_fn_per_worker(config: dict):
    model = torch.nn.Linear(8, 1)
    start_step = 0

    # [1] Resume from the latest checkpoint.
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
            model.load_state_dict(state["model"])
            start_step = state["step"] + 1

    for step in range(start_step, config["num_steps"]):
        ...  # Run a training step.
        save_checkpoint(model, step)
        if step == 0 and ray.train.get_context().get_world_rank() == 0:
            if not os.path.exists(config["marker"]):
                open(config["marker"], "w").close()
                raise RuntimeError("synthetic worker failure")


trainer = ray.train.torch.TorchTrainer(
    train_fn_per_worker,
    train_loop_config={"num_steps": 3, "marker": FAILED_ONCE},
    scaling_config=ray.train.ScalingConfig(num_workers=2),
    run_config=ray.train.RunConfig(
        name=f"train_run-{uuid.uuid4().hex}",
        # [3] Enable worker-level fault tolerance to gracefully handle
        # Train worker failures.
        failure_config=ray.train.FailureConfig(max_failures=3),
    ),
)
result = trainer.fit()

assert os.path.exists(FAILED_ONCE), "the synthetic failure did not happen"
assert result.metrics["step"] == 2
with result.checkpoint.as_directory() as checkpoint_dir:
    assert torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))["step"] == 2
print("ROUNDTRIP-OK")
