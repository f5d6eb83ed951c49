"""AIR's deprecated ``LightningTrainer`` + ``LightningConfigBuilder``: the builder's rules, the
AIR docstring example (an MNIST-like classifier from ``.fit_params`` loaders, synthetic images)
and the ``datasets`` flow (``"train"``/``"val"`` + ``datasets_iter_config``) with a worker
killed mid-fit, on 2 real workers and real Lightning."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

pl = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import phalanx  # noqa: E402
import phalanx.data  # noqa: E402
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from phalanx.errors import ConfigError  # noqa: E402
from phalanx.lightning import (  # noqa: E402
    LightningConfigBuilder,
    LightningTrainer,
    RayTrainReportCallback,
)

PIXELS = 28 * 28


def builder() -> LightningConfigBuilder:
    with pytest.warns(DeprecationWarning, match="LightningConfigBuilder is deprecated"):
        return LightningConfigBuilder()


class MNISTClassifier(pl.LightningModule):
    """The AIR docstring's module (accuracy computed by hand instead of torchmetrics)."""

    def __init__(self, lr, feature_dim):
        super().__init__()
        self.fc1 = torch.nn.Linear(PIXELS, feature_dim)
        self.fc2 = torch.nn.Linear(feature_dim, 10)
        self.lr = lr
        self.val_loss, self.val_acc = [], []

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.view(-1, PIXELS))))

    def training_step(self, batch, batch_idx):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, val_batch, batch_idx):
        x, y = (val_batch["x"], val_batch["y"]) if isinstance(val_batch, dict) else val_batch
        logits = self(x)
        self.val_loss.append(F.cross_entropy(logits, y))
        self.val_acc.append((logits.argmax(dim=1) == y).float().mean())

    def on_validation_epoch_end(self):
        self.log("ptl/val_loss", torch.stack(self.val_loss).mean(), sync_dist=True)
        self.log("ptl/val_accuracy", torch.stack(self.val_acc).mean(), sync_dist=True)
        self.val_loss.clear()
        self.val_acc.clear()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def images(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic 28x28 'digits': the label is which tenth of the image is brightest."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=rows)
    x = rng.random((rows, PIXELS), dtype=np.float32) * 0.1
    for i, label in enumerate(y):
        x[i, label * 78 : (label + 1) * 78] += 1.0
    return x, y


def quiet_trainer(root, **kwargs):
    return dict(
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=str(root),
        **kwargs,
    )


# -- the builder and the constructor (no workers) -------------------------------------------------


def test_builder_makes_airs_dictionary_and_checks_what_air_checked():
    config = (
        builder()
        .module(cls=MNISTClassifier, lr=1e-3, feature_dim=8)
        .trainer(max_epochs=2)
        .fit_params(ckpt_path=None)
        .strategy("ddp", find_unused_parameters=False)
        .checkpointing(monitor="ptl/val_loss", mode="min", save_top_k=2)
        .build()
    )
    assert config == {
        "_module_class": MNISTClassifier,
        "_module_init_config": {"lr": 1e-3, "feature_dim": 8},
        "_trainer_init_config": {"max_epochs": 2},
        "_trainer_fit_params": {"ckpt_path": None},
        "_strategy_config": {"_strategy_name": "ddp", "find_unused_parameters": False},
        "_model_checkpoint_config": {"monitor": "ptl/val_loss", "mode": "min", "save_top_k": 2},
    }
    assert "_module_class" not in builder().build()  # AIR left it out for Tune's search space
    with pytest.raises(ConfigError, match="'ddp', 'fsdp' or 'deepspeed'"):
        builder().strategy("horovod")
    with pytest.raises(ConfigError, match="LightningModule subclass"):
        builder().module(cls=MNISTClassifier(lr=1.0, feature_dim=2)).build()
    with pytest.raises(ConfigError, match="every_n_train_steps"):
        builder().checkpointing(every_n_train_steps=10)


def test_trainer_warns_with_the_modern_form_and_takes_its_checkpoint_config(tmp_path):
    config = builder().module(cls=MNISTClassifier).checkpointing(monitor="m", save_top_k=3)
    with pytest.warns(DeprecationWarning, match="LightningTrainer is deprecated") as caught:
        trainer = LightningTrainer(lightning_config=config.build())
    message = str(caught[0].message)
    assert "strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()]" in message
    assert "TorchTrainer(train_func, scaling_config=scaling_config" in message
    assert caught[0].filename == __file__
    # AIR's rule: with no CheckpointConfig of its own, the run keeps what ModelCheckpoint would.
    assert trainer.run_config.checkpoint_config == CheckpointConfig(
        num_to_keep=3, checkpoint_score_attribute="m", checkpoint_score_order="min"
    )
    own = CheckpointConfig(num_to_keep=1)
    with pytest.warns(DeprecationWarning):
        trainer = LightningTrainer(config.build(), run_config=RunConfig(checkpoint_config=own))
    assert trainer.run_config.checkpoint_config == own
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="datasets_iter_config"):
        LightningTrainer(config.build(), datasets={"train": phalanx.data.from_items([{"a": 1}])})


# -- on 2 workers ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_air_docstring_example_trains_from_fit_params_loaders(tmp_path):
    x, y = images(256, 0)
    vx, vy = images(64, 1)
    dataset = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)
    val_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.as_tensor(vx), torch.as_tensor(vy)), batch_size=32
    )
    lightning_config = (
        builder()
        .module(cls=MNISTClassifier, lr=1e-2, feature_dim=32)
        .trainer(**quiet_trainer(tmp_path / "pl", max_epochs=3, accelerator="cpu"))
        .fit_params(train_dataloaders=train_loader, val_dataloaders=val_loader)
        .build()
    )
    with pytest.warns(DeprecationWarning):
        trainer = LightningTrainer(
            lightning_config=lightning_config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="air_pl", storage_path=str(tmp_path / "runs")),
        )
    result = trainer.fit()

    assert result.error is None
    assert result.metrics_dataframe["epoch"].tolist() == [0, 1, 2]
    assert result.metrics["ptl/val_accuracy"] > 0.5  # it learned (chance is 0.1)
    # save_top_k's default (1) became num_to_keep=1, as in AIR
    assert len(result.best_checkpoints) == 1
    # one copy of each checkpoint, in storage: Lightning's own ModelCheckpoint wrote none
    assert not (tmp_path / "pl").exists()
    with result.checkpoint.as_directory() as d:
        ckpt = os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        model = MNISTClassifier.load_from_checkpoint(ckpt, lr=1e-2, feature_dim=32)
    assert model(torch.as_tensor(vx[:4])).shape == (4, 10)


class KillRank1(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        ctx = phalanx.get_context()
        if (ctx.get_attempt(), ctx.get_world_rank(), trainer.current_epoch) == (0, 1, 2):
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_datasets_flow_resumes_from_the_last_checkpoint_after_a_killed_worker(tmp_path):
    def as_dataset(rows, seed):
        x, y = images(rows, seed)
        return phalanx.data.from_numpy({"x": x, "y": y})

    lightning_config = (
        builder()
        .module(cls=MNISTClassifier, lr=1e-2, feature_dim=16)
        .trainer(**quiet_trainer(tmp_path / "pl", max_epochs=4, callbacks=[KillRank1()]))
        .checkpointing(monitor="ptl/val_loss", mode="min", save_top_k=2)
        .build()
    )
    with pytest.warns(DeprecationWarning):
        trainer = LightningTrainer(
            lightning_config=lightning_config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="air_pl_data",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
            ),
            datasets={"train": as_dataset(128, 0), "val": as_dataset(32, 1)},
            datasets_iter_config={"batch_size": 16},
        )
    result = trainer.fit()

    assert result.error is None and result.attempts == 2
    # Epochs 0 and 1 were checkpointed before the kill; the retry went on from epoch 2 with
    # Lightning's step count (4 steps per epoch per rank), not from scratch.
    history = result.metrics_dataframe
    assert history["epoch"].tolist() == [0, 1, 2, 3]
    assert history["step"].tolist() == [4, 8, 12, 16]
    # checkpointing(save_top_k=2, monitor, mode) kept the 2 best by ptl/val_loss
    kept = sorted(m["ptl/val_loss"] for _, m in result.best_checkpoints)
    assert len(kept) == 2 and kept == sorted(history["ptl/val_loss"])[:2]
