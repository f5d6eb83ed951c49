"""Ray's "Get started with PyTorch Lightning" flow on phalanx: real Lightning, 2 CPU workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pl = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402

import phalanx as train  # noqa: E402
from phalanx.data import from_numpy  # noqa: E402
from phalanx.lightning import (  # noqa: E402
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from phalanx.torch import TorchTrainer  # noqa: E402

pytestmark = pytest.mark.slow

EPOCHS = 4
ROWS, VAL_ROWS, BATCH = 64, 32, 8  # 4 steps per epoch on each of 2 ranks


def make_data(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1


class Regressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Unpack(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class KillRankOnce(pl.Callback):
    """SIGKILL one rank at the start of an epoch of the first attempt (a lost machine)."""

    def __init__(self, rank: int, epoch: int) -> None:
        self.rank, self.epoch = rank, epoch

    def on_train_epoch_start(self, trainer, pl_module):
        ctx = train.get_context()
        if (ctx.get_world_rank(), trainer.current_epoch, ctx.get_attempt()) == (
            self.rank,
            self.epoch,
            0,
        ):
            os.kill(os.getpid(), signal.SIGKILL)


def lightning_trainer(config, extra_callbacks=()):
    report = RayTrainReportCallback(validation=config.get("validation", False))
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[report, *extra_callbacks],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=config["root"],
    )
    return prepare_trainer(trainer)


def guide_loop(config):
    x, y = make_data(ROWS, 0)
    vx, vy = make_data(VAL_ROWS, 1)
    train_loader = torch.utils.data.DataLoader(Unpack(x, y), batch_size=BATCH, shuffle=True)
    val_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(vx, vy), batch_size=BATCH
    )
    trainer = lightning_trainer(config, [KillRankOnce(**config["kill"])])
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(Regressor(), train_loader, val_loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(Regressor(), train_loader, val_loader)
    return trainer.current_epoch


def test_guide_flow_checkpoints_kill_resume_and_predict_from_best(tmp_path):
    result = TorchTrainer(
        guide_loop,
        train_loop_config={
            "epochs": EPOCHS,
            "root": str(tmp_path),
            "kill": {"rank": 1, "epoch": 2},
        },
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            storage_path=str(tmp_path / "runs"),
            name="guide",
            failure_config=train.FailureConfig(max_failures=1),
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()

    assert result.attempts == 2  # rank 1 was killed once; the run resumed
    steps = ROWS // BATCH // 2
    assert result.metrics["epoch"] == EPOCHS - 1
    assert result.metrics["step"] == EPOCHS * steps  # Lightning's global_step survived the resume
    history = result.metrics_dataframe
    # Epochs 0 and 1 were committed before the kill; the resume trained only 2 and 3.
    assert history["epoch"].tolist() == list(range(EPOCHS))
    assert history["step"].tolist() == [steps * (e + 1) for e in range(EPOCHS)]
    assert {"loss", "val_loss"} <= set(history.columns)

    best = result.get_best_checkpoint("val_loss", "min")
    kept = {c.path: m["val_loss"] for c, m in result.best_checkpoints}
    assert len(kept) == 2 and kept[best.path] == min(history["val_loss"])
    with best.as_directory() as d:
        model = Regressor.load_from_checkpoint(os.path.join(d, "checkpoint.ckpt"))
    vx, vy = make_data(VAL_ROWS, 1)
    with torch.no_grad():
        predicted_loss = torch.nn.functional.mse_loss(model(vx), vy).item()
    # The predictions of the best checkpoint give back the val_loss Lightning reported for it.
    assert predicted_loss == pytest.approx(kept[best.path], rel=1e-5)


def dataset_loop(config):
    shard = train.get_dataset_shard("train")
    loader = shard.iter_torch_batches(batch_size=BATCH, dtypes=torch.float32)
    trainer = lightning_trainer(config)
    trainer.fit(Regressor(), train_dataloaders=loader)


def epoch_in_checkpoint(checkpoint):
    """A validation function (run by the driver on each committed checkpoint)."""
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "checkpoint.ckpt"), weights_only=False)
    return {"checkpoint_epoch": state["epoch"]}


def test_dataset_shard_iter_torch_batches_is_a_lightning_train_dataloader(tmp_path):
    x, y = make_data(ROWS, 0)
    dataset = from_numpy({"x": x.numpy(), "y": y.numpy()})
    result = TorchTrainer(
        dataset_loop,
        train_loop_config={"epochs": 3, "root": str(tmp_path), "validation": True},
        scaling_config=train.ScalingConfig(num_workers=2),
        datasets={"train": dataset},
        validation_config=train.ValidationConfig(epoch_in_checkpoint),
        run_config=train.RunConfig(storage_path=str(tmp_path / "runs"), name="data"),
    ).fit()
    history = result.metrics_dataframe
    steps = ROWS // 2 // BATCH  # each rank reads its half of the rows, every epoch
    assert history["step"].tolist() == [steps, 2 * steps, 3 * steps]
    assert np.isfinite(history["loss"]).all()
    # RayTrainReportCallback(validation=True): each checkpoint was validated on the driver.
    assert [m["checkpoint_epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]


SCRIPT = """
import json, os, sys
import pytorch_lightning as pl  # the older import name, as in Ray's guide
import torch
import phalanx as train
from phalanx.lightning import (RayDDPStrategy, RayLightningEnvironment,
                               RayTrainReportCallback, prepare_trainer)
from phalanx.torch import TorchTrainer
from _helpers.lightning_tiny import linear_regressor  # tests/ is on PYTHONPATH

Module = linear_regressor(pl)

def train_func(config):
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = pl.Trainer(max_epochs=2, devices="auto", accelerator="auto",
                         strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                         callbacks=[RayTrainReportCallback()], logger=False,
                         enable_progress_bar=False, enable_checkpointing=False,
                         default_root_dir=config["root"])
    trainer = prepare_trainer(trainer)
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=8))
    return type(trainer).__module__

result = TorchTrainer(train_func, train_loop_config={"root": sys.argv[1]},
                      scaling_config=train.ScalingConfig(num_workers=2),
                      run_config=train.RunConfig(storage_path=sys.argv[1], name="pl")).fit()
print(json.dumps({"metrics": result.metrics, "trainer_module": result.return_value,
                  "files": os.listdir(result.checkpoint.path),
                  "lightning_imported": "lightning" in sys.modules}))
"""


def test_pytorch_lightning_import_name_runs_the_guide(tmp_path):
    script = tmp_path / "guide_pl.py"
    script.write_text(textwrap.dedent(SCRIPT))
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["trainer_module"].startswith("pytorch_lightning.")
    assert not report["lightning_imported"]  # phalanx bound to pytorch_lightning alone
    assert report["metrics"]["epoch"] == 1 and report["metrics"]["step"] == 4
    assert report["files"] == ["checkpoint.ckpt"]
