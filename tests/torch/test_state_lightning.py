"""save_state from a Lightning callback (docs/guides/checkpoints.md's example): real Lightning,
2 CPU workers (DDP, gloo); a resumed run loads the model, the optimizer and the epoch back."""

from __future__ import annotations

from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402
from _helpers.lightning_tiny import linear_regressor  # noqa: E402
from resumed_fit import fit_then_resume  # noqa: E402

import phalanx  # noqa: E402
from phalanx.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer  # noqa: E402
from phalanx.torch import load_state, save_state  # noqa: E402

pytestmark = pytest.mark.slow


# -- the checkpoints guide's example ---------------------------------------------------------------
class SaveState(pl.Callback):
    """At each epoch's end: the model, the optimizer and the epochs done as a save_state
    checkpoint. When the run resumes, they are loaded back as training starts."""

    def on_train_start(self, trainer, pl_module):
        if checkpoint := phalanx.get_checkpoint():
            state = {"model": pl_module, "optimizer": trainer.optimizers[0], "epoch": 0}
            load_state(checkpoint, state)
            progress = trainer.fit_loop.epoch_progress.current  # Lightning counts from there
            progress.ready = progress.started = state["epoch"]
            progress.processed = progress.completed = state["epoch"]

    def on_train_epoch_end(self, trainer, pl_module):
        epochs_done = trainer.current_epoch + 1
        state = {"model": pl_module, "optimizer": trainer.optimizers[0], "epoch": epochs_done}
        metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
        phalanx.report({"epoch": epochs_done, **metrics}, checkpoint=save_state(state))


# -------------------------------------------------------------------------------------------------


Regressor = linear_regressor(pl, momentum=0.9)  # the momentum buffers: state to restore


def fingerprint(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    momentum = [s["momentum_buffer"] for s in optimizer.state.values() if "momentum_buffer" in s]
    return [
        float(sum(p.detach().double().sum() for p in module.parameters())),
        float(sum(m.double().sum() for m in momentum)),
    ]


class Fingerprints(pl.Callback):
    """What the test compares: the state as training starts (after a load) and at the end."""

    def on_train_start(self, trainer, pl_module):
        self.start = fingerprint(pl_module, trainer.optimizers[0])

    def on_train_end(self, trainer, pl_module):
        self.end = fingerprint(pl_module, trainer.optimizers[0])


def train_func(config: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(config["seed"])  # a resumed run starts from other weights
    x = torch.randn(32, 4)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8
    )
    prints = Fingerprints()
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[SaveState(), prints],  # SaveState first: it loads before prints looks
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=config["root"],
    )
    prepare_trainer(trainer).fit(Regressor(), loader)
    return {"start": prints.start, "end": prints.end}


def test_a_lightning_callback_saves_and_a_resumed_run_loads_model_optimizer_and_epoch(tmp_path):
    first, resumed = fit_then_resume(
        train_func, tmp_path, {"epochs": 2, "seed": 0}, {"epochs": 3, "seed": 1}
    )
    assert list(first.metrics_dataframe["epoch"]) == [1, 2]
    assert list(resumed.metrics_dataframe["epoch"]) == [3]  # only the epoch still to run
