# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.4-2.6 (AIR) docs, "Configuring Training" / "Data ingest" with ray.air.session: the
# AIR-era form of a Torch training loop, in Ray's own form. Synthetic data: a linear regression
# on ray.data.from_items rows, 2 workers, 3 epochs.
import torch

import ray
from ray.air import session, ScalingConfig, RunConfig
from ray.air.config import CheckpointConfig
from ray.train.torch import TorchTrainer, TorchCheckpoint


def train_loop_per_worker(config):
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    shard = session.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        for batch in shard.iter_torch_batches(batch_size=8, dtypes=torch.float32):
            x, y = batch["x"].unsqueeze(1), batch["y"].unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        session.report(
            {
                "loss": loss.item(),
                "epoch": epoch,
                "rank": session.get_world_rank(),
                "world_size": session.get_world_size(),
            },
            checkpoint=TorchCheckpoint.from_state_dict(model.state_dict()),
        )


train_dataset = ray.data.from_items([{"x": i / 32, "y": 2 * i / 32 + 1} for i in range(64)])

ray.init()
trainer = TorchTrainer(
    train_loop_per_worker,
    train_loop_config={"lr": 0.1, "epochs": 3},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(checkpoint_config=CheckpointConfig(num_to_keep=1)),
    datasets={"train": train_dataset},
)
result = trainer.fit()
ray.shutdown()

assert result.metrics["epoch"] == 2 and result.metrics["world_size"] == 2
state = TorchCheckpoint.from_checkpoint(result.checkpoint).get_model(torch.nn.Linear(1, 1))
assert isinstance(state, torch.nn.Linear)
print("ROUNDTRIP-OK")
