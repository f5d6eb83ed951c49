# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Get Started with Distributed Training using PyTorch Lightning"
# (doc/source/train/doc_code/getting_started_lightning.py), in Ray's own form. Synthetic data:
# a small linear classifier on random tensors instead of resnet18 on FashionMNIST, 1 epoch, CPU.
import torch
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

from ray.train.torch import TorchTrainer
from ray.train import ScalingConfig
import ray.train


# Model, Loss, Optimizer
class ImageClassifier(pl.LightningModule):
    def __init__(self):
        super(ImageClassifier, self).__init__()
        self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        outputs = self.forward(x)
        loss = self.criterion(outputs, y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=0.001)


def train_func(config):
    # Data
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    train_dataloader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)

    # Training
    model = ImageClassifier()
    # [1] Configure PyTorch Lightning Trainer.
    trainer = pl.Trainer(
        max_epochs=1,
        devices="auto",
        accelerator="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
        enable_progress_bar=False,
        logger=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=train_dataloader)


# [2] Configure scaling and resource requirements.
scaling_config = ScalingConfig(num_workers=2, use_gpu=False)

# [3] Launch distributed training job.
trainer = TorchTrainer(train_func, scaling_config=scaling_config)
result = trainer.fit()

assert result.error is None
assert "loss" in result.metrics and result.metrics["epoch"] == 0
assert result.checkpoint is not None
print("ROUNDTRIP-OK")
