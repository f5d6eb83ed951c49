# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Get Started with Distributed Training using PyTorch"
# (doc/source/train/doc_code/getting_started_pytorch.py), in Ray's own form. Synthetic data:
# a small linear classifier on random tensors instead of resnet18 on FashionMNIST, 2 epochs, CPU.
import tempfile
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.optim import Adam
from torch.nn import CrossEntropyLoss
from ray.train.torch import TorchTrainer
from ray.train import ScalingConfig, Checkpoint
import ray.train


def train_func(config):

    # Model, Loss, Optimizer
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    # [1] Prepare model.
    model = ray.train.torch.prepare_model(model)
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(2):
        for images, labels in train_loader:
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        checkpoint_dir = tempfile.mkdtemp()
        checkpoint_path = checkpoint_dir + "/model.checkpoint"
        torch.save(model.state_dict(), checkpoint_path)
        # [3] Report metrics and checkpoint.
        ray.train.report(
            {"loss": loss.item()}, checkpoint=Checkpoint.from_directory(checkpoint_dir)
        )


# [4] Configure scaling and resource requirements.
scaling_config = ScalingConfig(num_workers=2, use_gpu=False)

# [5] Launch distributed training job.
trainer = TorchTrainer(train_func, scaling_config=scaling_config)
result = trainer.fit()

assert result.error is None
assert "loss" in result.metrics
with result.checkpoint.as_directory() as checkpoint_dir:
    state = torch.load(checkpoint_dir + "/model.checkpoint")
assert any(key.endswith("1.weight") for key in state)
print("ROUNDTRIP-OK")
