"""Small real models for the serve tests: a frame, an MLP, and a training run per framework
(with a preprocessor)."""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.predict import TorchPredictor, XGBoostPredictor
from phalanx.preprocess import Chain, Concatenator, StandardScaler


def raw_frame(n: int = 400, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a, b = rng.normal(10, 3, n), rng.normal(-4, 0.5, n)
    return pd.DataFrame({"a": a, "b": b, "y": (a - 10 + 4 * (b + 4) > 0).astype(int)})


def make_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def fit_mlp(config):
    import torch

    from phalanx.torch import TorchCheckpoint

    frame = train.get_dataset_shard("train").to_pandas()
    x = torch.as_tensor(np.stack(frame["x"]).astype(np.float32))
    y = torch.as_tensor(frame["y"].to_numpy(np.float32)).unsqueeze(1)
    model = make_net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        optimizer.step()
    for epoch in range(2):  # two checkpoints: the best (lowest loss) is not the latest
        train.report(
            {"loss": float(loss.detach()) + epoch, "epoch": epoch},
            checkpoint=TorchCheckpoint.from_state_dict(model.state_dict()),
        )


def train_run(framework: str, storage: str):
    df = raw_frame()
    run_config = RunConfig(name=framework, storage_path=storage, verbose=0)
    if framework == "torch":
        from phalanx import CheckpointConfig

        run_config = RunConfig(
            name=framework,
            storage_path=storage,
            verbose=0,
            checkpoint_config=CheckpointConfig(
                checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        )
        return DataParallelTrainer(
            fit_mlp,
            datasets={"train": df},
            preprocessor=Chain(
                StandardScaler(["a", "b"]), Concatenator(["a", "b"], "x", dtype=np.float32)
            ),
            scaling_config=ScalingConfig(num_workers=1),
            run_config=run_config,
        ).fit()
    if framework == "xgboost":
        from phalanx.xgboost import XGBoostTrainer as Trainer

        params = {"objective": "binary:logistic", "max_depth": 3}
    else:
        from phalanx.lightgbm import LightGBMTrainer as Trainer

        params = {"objective": "binary", "num_leaves": 7, "verbose": -1}
    return Trainer(
        datasets={"train": df},
        label_column="y",
        params=params,
        num_boost_round=8,
        preprocessor=StandardScaler(["a", "b"]),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=run_config,
    ).fit()


class StaggeredTorchPredictor(TorchPredictor):
    """A TorchPredictor that loads 3 s later in every process after the first to load one: a
    server worker slower to load than its sibling. The first creates the file named by
    ``PHALANX_TEST_STAGGER_MARKER``."""

    @classmethod
    def from_checkpoint(cls, checkpoint, **kwargs):
        try:
            os.close(os.open(os.environ["PHALANX_TEST_STAGGER_MARKER"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(3.0)
        return super().from_checkpoint(checkpoint, **kwargs)


class GatedXGBoostPredictor(XGBoostPredictor):
    """An XGBoost predictor whose every model call first touches ``<gate>.waiting``, then waits
    until the file ``gate`` exists: a test holds requests in flight for as long as it needs, in
    this process or in a server worker process, with no sleep to outlast."""

    def __init__(self, model, preprocessor=None, gate: str = "") -> None:
        super().__init__(model, preprocessor=preprocessor)
        self.gate = gate

    def _predict_pandas(self, data, **kwargs):
        open(self.gate + ".waiting", "a").close()
        deadline = time.monotonic() + 60  # a test that fails before opening it must not hang
        while not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.gate} was never created")
            time.sleep(0.01)
        return super()._predict_pandas(data, **kwargs)
