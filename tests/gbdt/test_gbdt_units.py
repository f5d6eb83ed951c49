"""GBDT trainers without worker processes: checks at construction, the report callbacks'
rules, and single-worker runs on the thread engine."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from gbdt_data import auc, make_classification, make_regression

import phalanx
from phalanx import CheckpointConfig, ConfigError, DataConfig, RunConfig, ScalingConfig
from phalanx._gbdt import addresses, checks, threads
from phalanx._gbdt.reporting import ReportSettings, flatten_metrics

xgboost = pytest.importorskip("xgboost")
lightgbm = pytest.importorskip("lightgbm")

from phalanx.lightgbm import LightGBMConfig, LightGBMTrainer, get_network_params  # noqa: E402
from phalanx.lightgbm import ReportCallback as LGBCallback  # noqa: E402
from phalanx.xgboost import RayTrainReportCallback, XGBoostConfig, XGBoostTrainer  # noqa: E402
from phalanx.xgboost import ReportCallback as XGBCallback  # noqa: E402

THREAD = ScalingConfig(num_workers=1, engine="thread")
XGB_PARAMS = {"objective": "binary:logistic", "eval_metric": ["logloss", "auc"], "max_depth": 4}
LGB_PARAMS = {"objective": "binary", "metric": ["binary_logloss", "auc"], "num_leaves": 15}
TRAINERS = [(XGBoostTrainer, XGB_PARAMS), (LightGBMTrainer, LGB_PARAMS)]


@pytest.fixture(scope="module")
def small() -> tuple[pd.DataFrame, pd.DataFrame]:
    df = make_classification(3000, seed=3)
    return df.iloc[:2500].reset_index(drop=True), df.iloc[2500:].reset_index(drop=True)


# -- checks at construction ------------------------------------------------------------------


@pytest.mark.parametrize(("trainer", "params"), TRAINERS)
def test_missing_label_column_is_named_before_workers_start(trainer, params, small):
    train, valid = small
    with pytest.raises(ConfigError, match=r"label_column='target'.*\['target'\]"):
        trainer(datasets={"train": train, "valid": valid}, label_column="target", params=params)
    with pytest.raises(ConfigError, match="'valid'"):
        trainer(
            datasets={"train": train, "valid": valid.drop(columns="y")},
            label_column="y",
            params=params,
        )


@pytest.mark.parametrize(("trainer", "params"), TRAINERS)
def test_datasets_need_train_and_params_must_name_real_datasets(trainer, params, small):
    train, valid = small
    with pytest.raises(ConfigError, match="datasets=\\{'train'"):
        trainer(datasets={"training": train}, label_column="y", params=params)
    with pytest.raises(ConfigError, match=r"dmatrix_params.*\['test'\].*not in datasets"):
        trainer(
            datasets={"train": train},
            label_column="y",
            params=params,
            dmatrix_params={"test": {}},
        )
    with pytest.raises(ConfigError, match="checkpoint_score_attribute='validation-auc'"):
        trainer(
            datasets={"train": train, "valid": valid},
            label_column="y",
            params=params,
            run_config=RunConfig(
                checkpoint_config=CheckpointConfig(checkpoint_score_attribute="validation-auc")
            ),
        )


def test_params_xgboost_rejects_fail_at_construction(small):
    train, _ = small
    with pytest.raises(ConfigError, match="Unknown objective function: `binary:logitic`"):
        XGBoostTrainer(
            datasets={"train": train}, label_column="y", params={"objective": "binary:logitic"}
        )
    with pytest.raises(ConfigError, match="max_depth"):
        XGBoostTrainer(datasets={"train": train}, label_column="y", params={"max_depth": -2})
    with pytest.raises(ConfigError, match=r"unknown keyword argument.*early_stop"):
        XGBoostTrainer(datasets={"train": train}, label_column="y", params={}, early_stop=3)


def test_params_lightgbm_rejects_fail_at_construction(small):
    train, valid = small
    with pytest.raises(ConfigError, match="Unknown objective type name: binay"):
        LightGBMTrainer(datasets={"train": train}, label_column="y", params={"objective": "binay"})
    with pytest.raises(ConfigError, match=r"\['local_listen_port'\].*phalanx sets itself"):
        LightGBMTrainer(
            datasets={"train": train}, label_column="y", params={"local_listen_port": 1}
        )
    with pytest.raises(ConfigError, match="early stopping needs an evaluation set"):
        LightGBMTrainer(
            datasets={"train": train}, label_column="y", params={}, early_stopping_rounds=2
        )
    with pytest.raises(ConfigError, match="tree_learner='serial'"):
        LightGBMTrainer(
            datasets={"train": train},
            label_column="y",
            params={"tree_learner": "serial"},
            scaling_config=ScalingConfig(num_workers=2),
        )
    with pytest.raises(ConfigError, match="wait for each other forever"):
        LightGBMTrainer(
            datasets={"train": train, "valid": valid},
            label_column="y",
            params={"early_stopping_round": 3},
            dataset_config=DataConfig(datasets_to_split="all"),
            scaling_config=ScalingConfig(num_workers=2),
        )


@pytest.mark.parametrize(("trainer", "params"), TRAINERS)
def test_the_two_styles_do_not_mix(trainer, params, small):
    with pytest.raises(ConfigError, match=r"\['label_column', 'params'\]"):
        trainer(lambda: None, label_column="y", params=params)
    with pytest.raises(ConfigError, match="train_loop_config but no train_loop_per_worker"):
        trainer(datasets={"train": small[0]}, label_column="y", train_loop_config={"a": 1})
    with pytest.raises(ConfigError, match="engine='thread', num_workers=2"):
        trainer(lambda: None, scaling_config=ScalingConfig(num_workers=2, engine="thread"))


def test_configs_are_checked():
    with pytest.raises(ConfigError, match="xgboost_communicator='nccl'"):
        XGBoostConfig(xgboost_communicator="nccl")
    with pytest.raises(ConfigError, match="timeout_s=0"):
        XGBoostConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="time_out=0"):
        LightGBMConfig(time_out=0)
    with pytest.raises(ConfigError, match="xgboost_config="):
        XGBoostTrainer(lambda: None, xgboost_config=LightGBMConfig())
    assert XGBoostConfig().preload_modules == ("xgboost",)
    assert XGBoostConfig(timeout_s=30).to_dict() == {
        "xgboost_communicator": "rabit",
        "timeout_s": 30,
    }


def test_head_frame_reads_only_the_first_rows_of_every_kind_of_data(tmp_path, small):
    train, _ = small
    path = str(tmp_path / "train.parquet")
    train.to_parquet(path)
    kinds = [
        train,
        pa.Table.from_pandas(train),
        {c: train[c].to_numpy() for c in train.columns},
        path,
        phalanx.data.from_pandas(train),
    ]
    for value in kinds:
        head = checks.head_frame(value, rows=10)
        assert list(head.columns) == list(train.columns) and len(head) == 10
    assert checks.head_frame(lambda: train) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("phalanx-")]


# -- report callbacks --------------------------------------------------------------------------


def test_metrics_are_flattened_selected_and_renamed():
    evals = {"train": {"logloss": [0.5, 0.4]}, "valid": {"auc": [0.8, 0.9], "cv": [(0.1, 0.2)]}}
    flat = flatten_metrics(evals)
    assert flat == {
        "train-logloss": 0.4,
        "valid-auc": 0.9,
        "valid-cv-mean": 0.1,
        "valid-cv-std": 0.2,
    }
    settings = ReportSettings("CB", {"auc": "valid-auc"}, "m", 0, True, None)
    assert settings.select(flat) == {"auc": 0.9}
    settings = ReportSettings("CB", "valid-auc", "m", 0, True, lambda d: {**d, "x": 1})
    assert settings.select(flat) == {"valid-auc": 0.9, "x": 1}
    with pytest.raises(ConfigError, match=r"names \['valid-logloss'\].*computes"):
        ReportSettings("CB", ["valid-logloss"], "m", 0, True, None).select(flat)
    with pytest.raises(ConfigError, match="frequency=-1"):
        XGBCallback(frequency=-1)
    with pytest.raises(ConfigError, match="metrics=3"):
        LGBCallback(metrics=3)  # type: ignore[arg-type]
    assert [
        r for r in range(10) if ReportSettings("CB", None, "m", 4, True, None).checkpoint_due(r)
    ] == [3, 7]
    assert RayTrainReportCallback is XGBCallback


def test_get_network_params_outside_a_run_is_empty():
    assert get_network_params() == {}


def test_xgboost_warns_about_params_it_ignores(small, caplog):
    XGBoostTrainer(datasets={"train": small[0]}, label_column="y", params={"max_dept": 3})
    assert '"max_dept"' in caplog.text and "HINT" in caplog.text


def test_addresses_are_loopback_on_one_node_and_reserved_ports_stay_taken():
    def group(*nodes):
        workers = [SimpleNamespace(node_id=n, host=f"10.0.0.{i}") for i, n in enumerate(nodes)]
        return SimpleNamespace(workers=workers)

    assert addresses.group_addresses(group("a", "a")) == ["127.0.0.1", "127.0.0.1"]
    assert addresses.group_addresses(group("a", "b")) == ["10.0.0.0", "10.0.0.1"]
    held = addresses.reserve_port("127.0.0.1")
    try:
        port = held.getsockname()[1]
        for host in ("127.0.0.1", "0.0.0.0"):
            with socket.socket() as other, pytest.raises(OSError):
                other.bind((host, port))
    finally:
        held.close()


def test_thread_helpers():
    assert threads.cpu_share(3, 2) == 3
    assert threads.cpu_share(None, 10_000) == 1
    pytest.importorskip("xgboost")  # loads libgomp
    libs = threads._libgomps()
    assert libs
    with threads.default_threads(1):
        assert all(lib.omp_get_max_threads() == 1 for lib in libs)


# -- single worker on the thread engine ---------------------------------------------------------


@pytest.mark.parametrize(("trainer", "params"), TRAINERS)
def test_one_worker_reports_every_round_and_checkpoints(trainer, params, small, run_config):
    train, valid = small
    config = RunConfig(
        storage_path=run_config.storage_path,
        checkpoint_config=CheckpointConfig(checkpoint_frequency=4),
    )
    result = trainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params=params,
        num_boost_round=10,
        scaling_config=THREAD,
        run_config=config,
    ).fit()
    df = result.metrics_dataframe
    assert len(df) == 10  # the last round saves the final checkpoint, no extra report
    assert {"train-auc", "valid-auc"} <= set(result.metrics)
    assert df["checkpoint_dir_name"].notna().sum() == 3  # rounds 4, 8 and the end
    framework = "xgboost" if trainer is XGBoostTrainer else "lightgbm"
    assert result.checkpoint.get_metadata()["framework"] == framework  # for the predictors
    model = trainer.get_model(result.checkpoint)
    prediction = model.predict(_features(model, valid))
    assert auc(valid["y"].to_numpy(), prediction) > 0.8
    assert _rounds(model) == 10


@pytest.mark.parametrize(("trainer", "params"), TRAINERS)
def test_resume_from_a_checkpoint_boosts_up_to_the_total(trainer, params, small, run_config):
    train, valid = small
    first = trainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params=params,
        num_boost_round=6,
        scaling_config=THREAD,
        run_config=RunConfig(storage_path=run_config.storage_path, name="first"),
    ).fit()
    second = trainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params=params,
        num_boost_round=15,
        scaling_config=THREAD,
        run_config=RunConfig(storage_path=run_config.storage_path, name="second"),
        resume_from_checkpoint=first.checkpoint,
    ).fit()
    assert len(second.metrics_dataframe) == 9
    start, final = trainer.get_model(first.checkpoint), trainer.get_model(second.checkpoint)
    assert (_rounds(start), _rounds(final)) == (6, 15)
    # The resumed model starts with the first run's trees.
    x = _features(final, valid.head(50))
    assert np.allclose(_predict_rounds(final, x, 6), start.predict(x), atol=1e-6)


def test_xgboost_early_stopping_records_the_best_iteration(run_config):
    noise = make_classification(3000, seed=5)
    noise["y"] = np.random.default_rng(0).integers(0, 2, len(noise))  # nothing to learn
    result = XGBoostTrainer(
        datasets={"train": noise.iloc[:2000], "valid": noise.iloc[2000:]},
        label_column="y",
        params={"objective": "binary:logistic", "eval_metric": "logloss", "eta": 0.5},
        num_boost_round=50,
        early_stopping_rounds=3,
        scaling_config=THREAD,
        run_config=run_config,
    ).fit()
    best = result.metrics["best_iteration"]
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == best + 4 < 50
    assert int(model.attr("best_iteration")) == best
    assert result.metrics["best_score"] == pytest.approx(float(model.attr("best_score")))


def test_lightgbm_early_stopping_saves_the_best_model(run_config):
    noise = make_classification(3000, seed=5)
    noise["y"] = np.random.default_rng(0).integers(0, 2, len(noise))
    result = LightGBMTrainer(
        datasets={"train": noise.iloc[:2000], "valid": noise.iloc[2000:]},
        label_column="y",
        params={"objective": "binary", "metric": "binary_logloss", "learning_rate": 0.5},
        num_boost_round=50,
        early_stopping_rounds=3,
        scaling_config=THREAD,
        run_config=run_config,
    ).fit()
    best = result.metrics["best_iteration"]
    assert 1 <= best < 50 and "best_score" in result.metrics
    assert result.checkpoint is not None
    assert LightGBMTrainer.get_model(result.checkpoint).current_iteration() == best


def test_regression_with_weights_from_a_column(run_config):
    df = make_regression(3000, seed=2)
    df["w"] = 1.0
    result = XGBoostTrainer(
        datasets={"train": df.iloc[:2500], "valid": df.iloc[2500:]},
        label_column="y",
        params={"objective": "reg:squarederror", "eval_metric": "rmse"},
        dmatrix_params={"train": {"weight": "w"}, "valid": {"weight": "w"}},
        num_boost_round=5,
        scaling_config=THREAD,
        run_config=run_config,
    ).fit()
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.feature_names == [f"f{i}" for i in range(8)]  # neither y nor w is a feature
    assert "valid-rmse" in result.metrics


def test_ray_style_loop_with_the_callback(small, run_config):
    train, _ = small

    def train_func(config):
        shard = phalanx.get_dataset_shard("train").to_pandas()
        dtrain = xgboost.DMatrix(shard.drop(columns="y"), label=shard["y"])
        xgboost.train(
            config,
            dtrain,
            num_boost_round=4,
            evals=[(dtrain, "train")],
            callbacks=[XGBCallback(metrics={"loss": "train-logloss"}, frequency=2)],
        )

    result = XGBoostTrainer(
        train_func,
        train_loop_config={"objective": "binary:logistic"},
        datasets={"train": train},
        scaling_config=THREAD,
        run_config=run_config,
    ).fit()
    assert set(result.metrics) == {"loss"}
    assert result.metrics_dataframe["checkpoint_dir_name"].notna().sum() == 2
    assert XGBCallback.get_model(result.checkpoint).num_boosted_rounds() == 4


def _rounds(model) -> int:
    if isinstance(model, xgboost.Booster):
        return model.num_boosted_rounds()
    return model.current_iteration()


def _features(model, df: pd.DataFrame):
    x = df.drop(columns="y")
    return xgboost.DMatrix(x) if isinstance(model, xgboost.Booster) else x


def _predict_rounds(model, x, rounds: int):
    if isinstance(model, xgboost.Booster):
        return model.predict(x, iteration_range=(0, rounds))
    return model.predict(x, num_iteration=rounds)
