"""The GBDT seam: a third boosting library plugs in through ``BoostingLibrary`` alone, and the
checkpoint layout (model files, preprocessor, framework key) has one home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

import phalanx
from phalanx import Checkpoint, CheckpointConfig, ConfigError, RunConfig, ScalingConfig
from phalanx._foundation.checkpoint_files import MODEL_FILES, PREPROCESSOR_FILE, framework_of
from phalanx._gbdt.checkpoint import BoosterCheckpoint
from phalanx._gbdt.library import BuiltinLoopArgs
from phalanx._gbdt.reporting import MetricsArg, ReportingCore, ReportSettings
from phalanx._gbdt.spec import Frame
from phalanx._gbdt.trainer import GBDTTrainer
from phalanx.backend import BackendConfig

# lightgbm sets KMP_* variables when imported: import both at collection, not inside a test.
xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")

THREAD = ScalingConfig(num_workers=1, engine="thread")


# -- a toy boosting library: each round adds a step towards the mean residual ----------------


class MeanBooster:
    """A "boosted" model of constants: round k adds ``rate * mean(residual)``."""

    def __init__(self, steps: list[float] | None = None) -> None:
        self.steps = list(steps or [])

    def predict(self, rows: int) -> np.ndarray:
        return np.full(rows, sum(self.steps))

    def save_model(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.steps, f)


class ToyCallback:
    """The toy library's report callback, written like the real ones: it delegates."""

    CHECKPOINT_NAME = "model.toy"

    def __init__(
        self,
        metrics: MetricsArg = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        settings = ReportSettings(
            "ToyCallback", metrics, filename, frequency, checkpoint_at_end, None
        )
        self._core = ReportingCore(settings, "toy")

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> MeanBooster:
        with checkpoint.as_directory() as directory:
            return TOY.load_model(os.path.join(directory, cls.CHECKPOINT_NAME))

    def after_round(self, model: MeanBooster, evals: dict[str, dict[str, float]]) -> None:
        self._core.round_done(evals, len(model.steps), model.save_model)

    def after_training(self, model: MeanBooster) -> MeanBooster:
        self._core.training_done(len(model.steps), {}, model.save_model)
        return model


def toy_train(params: dict[str, Any], data: Frame, num_boost_round: int = 10) -> MeanBooster:
    """The toy library's own training function (its keywords are what a trainer accepts)."""
    raise NotImplementedError  # only its signature is read


class ToyLibrary:
    name = "Toy"
    framework = "toy"
    trainer = "ToyTrainer"
    config_arg = "toy_config"
    column_keys: frozenset[str] = frozenset()
    split_eval_sets = True
    thread_params: tuple[str, ...] = ("threads",)
    own_args = frozenset({"params", "data", "num_boost_round"})
    extra_args: frozenset[str] = frozenset()
    probe_args: frozenset[str] = frozenset()
    param_examples = "rate"
    model_file = "model.toy"
    config_type = BackendConfig
    report_callback = ToyCallback
    train_function = staticmethod(toy_train)

    def make_data(self, frame: Frame, reference: Any = None) -> Frame:
        return frame

    def train(self, params, data, evals, rounds, init_model, callbacks, **kwargs) -> MeanBooster:
        if not 0 < params.get("rate", 0.5) <= 1:
            raise ValueError(f"rate must be in (0, 1], got {params['rate']}")
        model = MeanBooster(init_model.steps if init_model is not None else None)
        for _ in range(rounds):
            residual = np.asarray(data.label) - model.predict(data.num_rows)
            model.steps.append(params.get("rate", 0.5) * float(residual.mean()))
            scores = {
                name: {"mae": float(np.abs(np.asarray(f.label) - model.predict(f.num_rows)).mean())}
                for name, f in evals.items()
            }
            for callback in callbacks or []:
                callback.after_round(model, scores)
        return model

    def rounds_done(self, model: MeanBooster) -> int:
        return len(model.steps)

    def load_model(self, path: str) -> MeanBooster:
        with open(path) as f:
            return MeanBooster(json.load(f))

    def worker_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def probe_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    def probe_errors(self) -> tuple[type[BaseException], ...]:
        return (ValueError,)

    def probe_message(self, error: BaseException) -> str:
        return f"{error}\nHINT: fix params."

    def probe_warning(self, message: str) -> bool:
        return False

    def extra_checks(self, spec: Any, scaling: Any, data_config: Any) -> None:
        return None


TOY = ToyLibrary()


class ToyTrainer(GBDTTrainer):
    _default_backend_config = BackendConfig
    _library = TOY

    def __init__(
        self,
        *,
        datasets: dict[str, Any],
        label_column: str,
        params: dict[str, Any],
        num_boost_round: int,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        **train_kwargs: Any,
    ) -> None:
        self._init_gbdt(
            None,
            None,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=None,
            resume_from_checkpoint=resume_from_checkpoint,
            legacy=BuiltinLoopArgs(label_column, params, num_boost_round, None),
            train_kwargs=train_kwargs,
        )


class ToyCheckpoint(BoosterCheckpoint):
    _library = TOY
    MODEL_FILENAME = "model.toy"


@pytest.fixture
def frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    train = pd.DataFrame({"x": rng.normal(size=200), "y": 3.0 + rng.normal(size=200) * 0.1})
    return {"train": train, "valid": train.iloc[:50].copy()}


def test_a_third_library_runs_the_builtin_loop_checks_and_resumes(frames, tmp_path):
    def fit(rounds: int, resume: Checkpoint | None = None) -> phalanx.Result:
        return ToyTrainer(
            datasets=frames,
            label_column="y",
            params={"rate": 0.5},
            num_boost_round=rounds,
            scaling_config=THREAD,
            run_config=RunConfig(
                storage_path=str(tmp_path),
                checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
            ),
            resume_from_checkpoint=resume,
        ).fit()

    result = fit(5)
    df = result.metrics_dataframe
    assert len(df) == 5  # one report per round; the last carries the final checkpoint
    assert df["checkpoint_dir_name"].notna().sum() == 3  # rounds 2, 4 and the end
    assert result.metrics["valid-mae"] < 0.2
    assert result.checkpoint.get_metadata()["framework"] == "toy"
    assert len(ToyTrainer.get_model(result.checkpoint).steps) == 5
    resumed = fit(8, resume=result.checkpoint)
    assert len(resumed.metrics_dataframe) == 3  # rounds 6..8 only
    assert len(ToyCheckpoint(resumed.checkpoint.path).get_model().steps) == 8

    with pytest.raises(ConfigError, match=r"Toy rejected the training setup(.|\n)*rate must be"):
        ToyTrainer(datasets=frames, label_column="y", params={"rate": 7}, num_boost_round=3)
    with pytest.raises(
        ConfigError, match=r"got unknown keyword.*\['nonsense'\](.|\n)*HINT: booster"
    ):
        ToyTrainer(datasets=frames, label_column="y", params={}, num_boost_round=3, nonsense=1)


# -- the checkpoint layout ----------------------------------------------------------------------


def test_booster_checkpoints_share_from_model_and_the_file_layout(tmp_path):
    from phalanx.lightgbm import LightGBMCheckpoint
    from phalanx.lightgbm import ReportCallback as LGBCallback
    from phalanx.xgboost import ReportCallback as XGBCallback
    from phalanx.xgboost import XGBoostCheckpoint

    x = np.random.default_rng(1).normal(size=(100, 3))
    y = (x[:, 0] > 0).astype(int)
    xgb = xgboost.train({"nthread": 1}, xgboost.DMatrix(x, label=y), num_boost_round=2)
    lgb = lightgbm.train(
        {"verbosity": -1, "num_threads": 1}, lightgbm.Dataset(x, label=y), num_boost_round=2
    )
    saved = XGBoostCheckpoint.from_model(xgb, preprocessor={"p": 1}, path=str(tmp_path / "x"))
    assert isinstance(saved, XGBoostCheckpoint)
    assert sorted(os.listdir(saved.path)) == sorted(["model.json", PREPROCESSOR_FILE])
    assert saved.get_model().num_boosted_rounds() == 2
    assert saved.get_preprocessor() == {"p": 1}
    lgb_saved = LightGBMCheckpoint.from_model(lgb, path=str(tmp_path / "l"))
    assert os.listdir(lgb_saved.path) == ["model.txt"]
    assert lgb_saved.get_model().current_iteration() == 2
    # The trainers' and callbacks' file names come from the same table.
    assert XGBCallback.CHECKPOINT_NAME in MODEL_FILES["xgboost"]
    assert LGBCallback.CHECKPOINT_NAME == LightGBMCheckpoint.MODEL_FILENAME
    assert (framework_of(saved), framework_of(lgb_saved)) == ("xgboost", "lightgbm")
    with pytest.raises(FileNotFoundError, match=r"model\.json.*\n.*no XGBoost model"):
        XGBoostCheckpoint(lgb_saved.path).get_model()


def test_import_phalanx_predict_imports_no_framework():
    code = (
        "import sys, phalanx.predict\n"
        "from phalanx.predict import checkpoint_framework, BatchPredictor\n"
        "print([m for m in ('torch', 'xgboost', 'lightgbm') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_predict_reexports_the_framework_packages_predictors():
    import phalanx.lightgbm
    import phalanx.predict
    import phalanx.xgboost

    assert phalanx.predict.XGBoostPredictor is phalanx.xgboost.XGBoostPredictor
    assert phalanx.predict.LightGBMPredictor is phalanx.lightgbm.LightGBMPredictor
