"""LightGBMTrainer on real local worker processes, LightGBM's network on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
from gbdt_data import auc, make_classification, rmse

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

lightgbm = pytest.importorskip("lightgbm")

from phalanx.lightgbm import LightGBMTrainer, ReportCallback, get_network_params  # noqa: E402

pytestmark = pytest.mark.slow

TWO = ScalingConfig(num_workers=2)
ROUNDS = 80


def _single_process(params, train, rounds=ROUNDS):
    data = lightgbm.Dataset(train.drop(columns="y"), label=train["y"])
    return lightgbm.train({**params, "num_threads": 1, "verbosity": -1}, data, rounds)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_two_workers_reach_single_process_quality(task, request, run_config):
    train, valid = request.getfixturevalue(task)
    if task == "classification":
        params = {"objective": "binary", "metric": ["binary_logloss", "auc"]}
        score, name = auc, "valid-auc"
    else:
        params = {"objective": "regression", "metric": "rmse"}
        score, name = rmse, "valid-rmse"
    params = {**params, "num_leaves": 31, "learning_rate": 0.2}
    result = LightGBMTrainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params=params,
        num_boost_round=ROUNDS,
        scaling_config=TWO,
        run_config=run_config,
    ).fit()
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == ROUNDS
    x = valid.drop(columns="y")
    ours = score(valid["y"].to_numpy(), model.predict(x))
    single = score(valid["y"].to_numpy(), _single_process(params, train).predict(x))
    if task == "classification":
        assert ours > 0.95 and abs(ours - single) < 0.005
    else:
        assert abs(ours - single) / single < 0.03
    # Every worker evaluates the whole validation set: same numbers, the true metric.
    ranks = result.all_ranks_metrics_dataframe.groupby("rank")[name].last()
    assert ranks[0] == pytest.approx(ranks[1])
    assert result.metrics[name] == pytest.approx(ours, rel=1e-6)


def test_each_worker_boosts_on_its_own_shard_over_loopback(run_config):
    df = make_classification(4000, seed=7)
    df["row"] = np.arange(len(df))

    def train_func():
        shard = phalanx.get_dataset_shard("train").to_pandas()
        rows = shard.pop("row").to_numpy()
        network = get_network_params()
        data = lightgbm.Dataset(shard.drop(columns="y"), label=shard["y"])
        params = {"objective": "binary", "verbosity": -1, "tree_learner": "data", **network}
        lightgbm.train(params, data, num_boost_round=3)
        phalanx.report({"rows": json.dumps(rows.tolist()), **network})

    result = LightGBMTrainer(
        train_func, datasets={"train": df}, scaling_config=TWO, run_config=run_config
    ).fit()
    last = result.all_ranks_metrics_dataframe.groupby("rank").last()
    rows = {rank: set(json.loads(last.loc[rank, "rows"])) for rank in (0, 1)}
    assert len(rows[0]) == len(rows[1]) == 2000 and not rows[0] & rows[1]
    assert rows[0] | rows[1] == set(range(4000))
    machines = last.loc[0, "machines"].split(",")
    assert last.loc[1, "machines"] == last.loc[0, "machines"] and len(machines) == 2
    assert all(m.startswith("127.0.0.1:") for m in machines)
    ports = [int(m.split(":")[1]) for m in machines]
    assert list(last["local_listen_port"]) == ports and ports[0] != ports[1]
    assert set(last["num_machines"]) == {2}


class KillOnce:
    """A lightgbm callback: SIGKILLs rank ``rank`` of the first attempt after ``rounds``
    rounds; writes the round each attempt started from into ``log``."""

    order = 5
    before_iteration = False

    def __init__(self, rank: int, rounds: int, log: str) -> None:
        self.rank, self.rounds, self.log = rank, rounds, log
        self.started = False

    def __call__(self, env) -> None:
        context = phalanx.get_context()
        if not self.started and context.get_world_rank() == 0:
            self.started = True
            with open(self.log, "a") as f:
                f.write(f"{context.get_attempt()} {env.iteration}\n")
        first_attempt = (context.get_attempt(), context.get_world_rank()) == (0, self.rank)
        if first_attempt and env.iteration + 1 == self.rounds:
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_resumes_from_the_latest_checkpoint(classification, run_config, tmp_path):
    train, valid = classification
    log = str(tmp_path / "starts.txt")
    result = LightGBMTrainer(
        datasets={"train": train, "valid": valid},
        label_column="y",
        params={"objective": "binary", "metric": "binary_logloss", "num_leaves": 15},
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
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == 20
    assert auc(valid["y"].to_numpy(), model.predict(valid.drop(columns="y"))) > 0.9


def test_early_stopping_is_one_decision_across_workers(run_config):
    noise = make_classification(6000, seed=5)
    noise["y"] = np.random.default_rng(1).integers(0, 2, len(noise))  # nothing to learn
    result = LightGBMTrainer(
        datasets={"train": noise.iloc[:4000], "valid": noise.iloc[4000:]},
        label_column="y",
        params={"objective": "binary", "metric": "binary_logloss", "learning_rate": 0.5},
        num_boost_round=60,
        early_stopping_rounds=3,
        scaling_config=TWO,
        run_config=run_config,
    ).fit()
    best = result.metrics["best_iteration"]
    assert 1 <= best < 60
    per_rank = result.all_ranks_metrics_dataframe.groupby("rank")["best_iteration"].last()
    assert list(per_rank) == [best, best]
    assert ReportCallback.get_model(result.checkpoint).current_iteration() == best
