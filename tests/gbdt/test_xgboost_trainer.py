"""XGBoostTrainer on real local worker processes, XGBoost's collective on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
from gbdt_data import auc, make_classification, rmse

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

xgboost = pytest.importorskip("xgboost")

from phalanx.xgboost import ReportCallback, XGBoostTrainer  # noqa: E402

pytestmark = pytest.mark.slow

TWO = ScalingConfig(num_workers=2)
ROUNDS = 80


def _single_process(params, train, rounds=ROUNDS):
    dtrain = xgboost.DMatrix(train.drop(columns="y"), label=train["y"])
    return xgboost.train({**params, "nthread": 1}, dtrain, num_boost_round=rounds)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_two_workers_reach_single_process_quality(task, request, run_config):
    train, valid = request.getfixturevalue(task)
    if task == "classification":
        params = {"objective": "binary:logistic", "eval_metric": ["logloss", "auc"]}
        score, name, tolerance = auc, "valid-auc", 0.005
    else:
        params = {"objective": "reg:squarederror", "eval_metric": "rmse"}
        score, name, tolerance = rmse, "valid-rmse", 0.03
    params = {**params, "max_depth": 6, "eta": 0.3, "tree_method": "hist"}
    result = XGBoostTrainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params=params,
        num_boost_round=ROUNDS,
        scaling_config=TWO,
        run_config=run_config,
    ).fit()
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == ROUNDS
    dvalid = xgboost.DMatrix(valid.drop(columns="y"))
    ours = score(valid["y"].to_numpy(), model.predict(dvalid))
    single = score(valid["y"].to_numpy(), _single_process(params, train).predict(dvalid))
    if task == "classification":
        assert ours > 0.95 and abs(ours - single) < tolerance
    else:
        assert abs(ours - single) / single < tolerance
    # The reported metric is the collective's (both ranks agree), close to the true one.
    ranks = result.all_ranks_metrics_dataframe.groupby("rank")[name].last()
    assert ranks[0] == pytest.approx(ranks[1])
    assert result.metrics[name] == pytest.approx(ours, rel=0.02)


def test_each_worker_boosts_on_its_own_shard(run_config):
    df = make_classification(4000, seed=7)
    df["row"] = np.arange(len(df))

    def train_func():
        from xgboost import collective

        shard = phalanx.get_dataset_shard("train").to_pandas()
        rows = shard.pop("row").to_numpy()
        dtrain = xgboost.DMatrix(shard.drop(columns="y"), label=shard["y"])
        xgboost.train({"objective": "binary:logistic"}, dtrain, num_boost_round=3)
        phalanx.report(
            {
                "rows": json.dumps(rows.tolist()),
                "xgboost_rank": collective.get_rank(),
                "xgboost_world": collective.get_world_size(),
                "xgboost_rows": dtrain.num_row(),
            }
        )

    result = XGBoostTrainer(
        train_func, datasets={"train": df}, scaling_config=TWO, run_config=run_config
    ).fit()
    last = result.all_ranks_metrics_dataframe.groupby("rank").last()
    rows = {rank: set(json.loads(last.loc[rank, "rows"])) for rank in (0, 1)}
    assert len(rows[0]) == len(rows[1]) == 2000 and not rows[0] & rows[1]
    assert rows[0] | rows[1] == set(range(4000))
    assert list(last["xgboost_rank"]) == [0, 1] and set(last["xgboost_world"]) == {2}
    assert list(last["xgboost_rows"]) == [2000, 2000]


class KillOnce(xgboost.callback.TrainingCallback):
    """SIGKILLs rank ``rank`` of the first attempt after ``rounds`` rounds; writes the number
    of rounds each attempt started from into ``log``."""

    def __init__(self, rank: int, rounds: int, log: str) -> None:
        self.rank, self.rounds, self.log = rank, rounds, log

    def before_training(self, model):
        context = phalanx.get_context()
        if context.get_world_rank() == 0:
            with open(self.log, "a") as f:
                f.write(f"{context.get_attempt()} {model.num_boosted_rounds()}\n")
        return model

    def after_iteration(self, model, epoch, evals_log) -> bool:
        context = phalanx.get_context()
        first_attempt = (context.get_attempt(), context.get_world_rank()) == (0, self.rank)
        if first_attempt and model.num_boosted_rounds() == self.rounds:
            os.kill(os.getpid(), signal.SIGKILL)
        return False


def test_a_killed_worker_resumes_from_the_latest_checkpoint(classification, run_config, tmp_path):
    train, valid = classification
    log = str(tmp_path / "starts.txt")
    result = XGBoostTrainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params={"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 4},
        num_boost_round=20,
        callbacks=[KillOnce(rank=1, rounds=12, log=log)],
        scaling_config=TWO,
        run_config=RunConfig(
            storage_path=run_config.storage_path,
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(checkpoint_frequency=5),
        ),
    ).fit()
    assert result.attempts == 2
    with open(log) as f:
        assert f.read().split("\n")[:2] == ["0 0", "1 10"]  # restarted from round 10's model
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == 20
    dvalid = xgboost.DMatrix(valid.drop(columns="y"))
    assert auc(valid["y"].to_numpy(), model.predict(dvalid)) > 0.9


def test_early_stopping_is_one_decision_across_workers(run_config):
    noise = make_classification(6000, seed=5)
    noise["y"] = np.random.default_rng(1).integers(0, 2, len(noise))  # nothing to learn
    result = XGBoostTrainer(
        datasets={"train": noise.iloc[:4000], "valid": noise.iloc[4000:]},
        label_column="y",
        params={"objective": "binary:logistic", "eval_metric": "logloss", "eta": 0.5},
        num_boost_round=60,
        early_stopping_rounds=3,
        scaling_config=TWO,
        run_config=run_config,
    ).fit()
    best = result.metrics["best_iteration"]
    model = ReportCallback.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == best + 4 < 60
    per_rank = result.all_ranks_metrics_dataframe.groupby("rank")["best_iteration"].last()
    assert list(per_rank) == [best, best]


class SlowRounds(xgboost.callback.TrainingCallback):
    """Boosting rounds slow enough for the progress line to see several of them."""

    def after_iteration(self, model, epoch, evals_log) -> bool:
        import time

        time.sleep(0.05)
        return False


def test_progress_line_shows_the_boosting_round_out_of_num_boost_round(
    classification, run_config, caplog, monkeypatch
):
    monkeypatch.setenv("PHALANX_PROGRESS_INTERVAL_S", "0.1")  # output is not a terminal here
    caplog.set_level("INFO", logger="phalanx")
    train, valid = classification
    XGBoostTrainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params={"objective": "binary:logistic", "eval_metric": "logloss", "nthread": 1},
        num_boost_round=30,
        callbacks=[SlowRounds()],
        scaling_config=ScalingConfig(num_workers=1),
        run_config=run_config,
    ).fit()
    lines = [r.getMessage() for r in caplog.records if "boosting round" in r.getMessage()]
    assert lines, caplog.text
    assert all(" · boosting round " in ln and "/30 · " in ln for ln in lines)
    assert any("valid-logloss=" in ln for ln in lines)
