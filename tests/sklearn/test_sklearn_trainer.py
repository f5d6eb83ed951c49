"""SklearnTrainer on a real local worker process with real scikit-learn: AIR's docstring
example and guide flows, its metric names and CPU rules, cross-validation, a preprocessor
fitted in fit(), and a worker killed during the fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold, cross_validate
from sklearn_models import KilledOnFirstAttempt, PidRidge, classification, regression

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.predict import BatchPredictor
from phalanx.preprocess import Chain, OrdinalEncoder, StandardScaler
from phalanx.sklearn import SklearnCheckpoint, SklearnPredictor, SklearnTrainer

TWO_CPUS = ScalingConfig(trainer_resources={"CPU": 2})


@pytest.fixture
def run_config(tmp_path) -> RunConfig:
    return RunConfig(storage_path=str(tmp_path / "runs"))


def test_air_docstring_example(run_config):
    train = [{"x": x, "y": x + 1} for x in range(32)]
    trainer = SklearnTrainer(
        estimator=RandomForestRegressor(n_estimators=10),
        label_column="y",
        scaling_config=ScalingConfig(trainer_resources={"CPU": 2}),
        datasets={"train": train},
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.metrics["fit_time"] > 0 and result.metrics["done"] is True
    estimator = SklearnTrainer.get_model(result.checkpoint)
    assert estimator.n_jobs == 2  # the trainer's CPUs became the estimator's n_jobs
    assert abs(estimator.predict(pd.DataFrame({"x": [10.0]}))[0] - 11) < 2
    assert SklearnCheckpoint.from_checkpoint(result.checkpoint).get_estimator().n_jobs == 2


def test_every_other_dataset_is_scored_and_cv_folds_match_cross_validate(run_config):
    df = regression(600)
    train, valid = df.iloc[:450].reset_index(drop=True), df.iloc[450:]
    estimator = RandomForestRegressor(n_estimators=15, max_depth=6, random_state=0)
    result = SklearnTrainer(
        estimator,
        label_column="y",
        datasets={"train": train, "valid": valid},
        cv=3,
        return_train_score_cv=True,
        scaling_config=TWO_CPUS,
        run_config=run_config,
    ).fit()
    fitted = SklearnTrainer.get_model(result.checkpoint)
    features = valid.drop(columns="y")
    assert result.metrics["valid"]["test_score"] == pytest.approx(
        fitted.score(features, valid["y"])
    )
    assert result.metrics["valid"]["score_time"] >= 0
    expected = cross_validate(
        estimator, train.drop(columns="y"), train["y"], cv=3, return_train_score=True
    )
    cv = result.metrics["cv"]
    assert cv["test_score"] == pytest.approx(list(expected["test_score"]))
    assert cv["train_score"] == pytest.approx(list(expected["train_score"]))
    assert cv["test_score_mean"] == pytest.approx(np.mean(expected["test_score"]))
    assert cv["test_score_std"] == pytest.approx(np.std(expected["test_score"]))
    assert len(cv["fit_time"]) == 3 and cv["fit_time_mean"] > 0
    # Ray's nested names work where phalanx takes a metric name
    assert result.get_best_checkpoint("cv/test_score_mean", "max") is not None


def test_several_scorers_and_no_cv_as_in_airs_test_fit(run_config):
    df = classification(500)
    result = SklearnTrainer(
        LogisticRegression(),
        label_column="y",
        scoring=["accuracy", "roc_auc"],
        datasets={"train": df.iloc[:400], "valid": df.iloc[400:], "test": df.iloc[300:]},
        run_config=run_config,
    ).fit()
    assert "cv" not in result.metrics
    for name in ("valid", "test"):
        assert set(result.metrics[name]) == {"score_time", "test_accuracy", "test_roc_auc"}
        assert result.metrics[name]["test_accuracy"] > 0.8


def test_cpu_rules_estimator_n_jobs_or_parallel_folds(run_config, tmp_path):
    df = regression(300)
    # An estimator with n_jobs gets the CPUs and the folds run one by one (AIR's default).
    forest = SklearnTrainer(
        RandomForestRegressor(n_estimators=5),
        label_column="y",
        cv=3,
        datasets={"train": df},
        scaling_config=TWO_CPUS,
        run_config=run_config,
    ).fit()
    assert SklearnTrainer.get_model(forest.checkpoint).n_jobs == 2
    # set_estimator_cpus=False leaves n_jobs alone (AIR's test_no_auto_cpu_params)
    kept = SklearnTrainer(
        RandomForestRegressor(n_estimators=5, n_jobs=1),
        label_column="y",
        datasets={"train": df},
        scaling_config=TWO_CPUS,
        set_estimator_cpus=False,
        run_config=run_config,
    ).fit()
    assert SklearnTrainer.get_model(kept.checkpoint).n_jobs == 1
    # Without an n_jobs, the folds are fitted side by side in joblib's (loky) processes.
    pids = {}
    for parallel in (None, False):
        log = tmp_path / f"pids_{parallel}.txt"
        SklearnTrainer(
            PidRidge(log=str(log)),
            label_column="y",
            cv=3,
            parallelize_cv=parallel,
            datasets={"train": df},
            scaling_config=TWO_CPUS,
            run_config=run_config,
        ).fit()
        pids[parallel] = log.read_text().split()
    final, *folds = pids[None]
    assert len(folds) == 3 and final not in folds  # folds in other processes
    assert len(set(pids[False])) == 1  # one by one in the worker
    # Asked to parallelise the folds, the final fit still gets both CPUs (Ray gave it one).
    both = SklearnTrainer(
        RandomForestRegressor(n_estimators=5),
        label_column="y",
        cv=3,
        parallelize_cv=True,
        datasets={"train": df},
        scaling_config=TWO_CPUS,
        run_config=run_config,
    ).fit()
    assert SklearnTrainer.get_model(both.checkpoint).n_jobs == 2
    assert len(both.metrics["cv"]["test_score"]) == 3


def test_params_are_set_on_a_clone_and_groups_reach_the_splitter(run_config):
    df = regression(300)
    df["cv_groups"] = np.arange(len(df)) % 3
    estimator = Ridge()
    trainer = SklearnTrainer(
        estimator,
        label_column="y",
        params={"alpha": 7.0},
        cv=GroupKFold(n_splits=3),
        datasets={"train": df},
        run_config=run_config,
    )
    result = trainer.fit()
    assert SklearnTrainer.get_model(result.checkpoint).alpha == 7.0
    assert estimator.alpha == 1.0 and trainer.params == {"alpha": 7.0}
    fitted = SklearnTrainer.get_model(result.checkpoint)
    assert fitted.n_features_in_ == 4  # cv_groups is not a feature
    assert len(result.metrics["cv"]["test_score"]) == 3


def test_a_preprocessor_fitted_in_fit_is_applied_by_the_predictor(run_config):
    df = regression(400, offset=100.0)
    columns = ["a", "b", "c", "d"]
    result = SklearnTrainer(
        Ridge(alpha=1.0),
        label_column="y",
        datasets={"train": df.iloc[:300], "valid": df.iloc[300:]},
        preprocessor=StandardScaler(columns=columns),
        run_config=run_config,
    ).fit()
    preprocessor = result.checkpoint.get_preprocessor()
    assert preprocessor.stats_["mean(a)"] == pytest.approx(df["a"].iloc[:300].mean())
    assert result.metrics["valid"]["test_score"] > 0.95  # scored on scaled data
    raw = df.iloc[300:].drop(columns="y")
    predictions = SklearnPredictor.from_checkpoint(result.checkpoint).predict(raw)
    estimator = SklearnTrainer.get_model(result.checkpoint)
    scaled = preprocessor.transform_batch(raw.copy())
    assert np.allclose(predictions["predictions"], estimator.predict(scaled[columns]))
    assert not np.allclose(predictions["predictions"], estimator.predict(raw))


def test_airs_sklearn_guide_flow_preprocess_train_cv_then_batch_predict(run_config):
    # AIR's "Training a model with Sklearn" example: Chain(OrdinalEncoder, StandardScaler),
    # RandomForestClassifier with cv and trainer CPUs, then BatchPredictor on unlabelled rows.
    df = classification(600, seed=2)
    df["colour"] = np.where(df["a"] > 0, "red", "blue")
    train, valid, test = df.iloc[:400], df.iloc[400:500], df.iloc[500:]
    preprocessor = Chain(OrdinalEncoder(columns=["colour"]), StandardScaler(columns=["b", "c"]))
    result = SklearnTrainer(
        estimator=RandomForestClassifier(n_estimators=20, random_state=0),
        label_column="y",
        datasets={"train": train, "valid": valid},
        cv=3,
        scaling_config=TWO_CPUS,
        preprocessor=preprocessor,
        run_config=run_config,
    ).fit()
    assert result.metrics["valid"]["test_score"] > 0.8
    assert result.metrics["cv"]["test_score_mean"] > 0.8
    batch = BatchPredictor.from_checkpoint(result.checkpoint, SklearnPredictor)
    predictions = batch.predict(test.drop(columns="y"), batch_size=32).to_pandas()
    assert len(predictions) == len(test)
    assert (predictions["predictions"].to_numpy() == test["y"].to_numpy()).mean() > 0.8


def test_a_worker_killed_during_fit_fits_again_and_a_finished_run_is_kept(tmp_path):
    df = regression(200)
    log = tmp_path / "attempts.txt"

    def trainer() -> SklearnTrainer:
        return SklearnTrainer(
            KilledOnFirstAttempt(log=str(log)),
            label_column="y",
            datasets={"train": df.iloc[:150], "valid": df.iloc[150:]},
            run_config=RunConfig(
                name="killed",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
                checkpoint_config=CheckpointConfig(num_to_keep=1),
            ),
        )

    result = trainer().fit()
    assert result.attempts == 2
    assert log.read_text().split() == ["0", "1"]  # the fit started again from scratch
    score = result.metrics["valid"]["test_score"]
    assert score > 0.9
    again = trainer().fit()  # the same run: its fitted estimator is kept, nothing refits
    assert log.read_text().split() == ["0", "1"]
    assert again.metrics["valid"]["test_score"] == score


def test_without_label_column_the_estimator_is_fitted_and_nothing_scored(run_config):
    from sklearn.cluster import KMeans

    df = regression(200).drop(columns="y")
    result = SklearnTrainer(
        KMeans(n_clusters=3, n_init=2, random_state=0),
        datasets={"train": df, "valid": df},
        cv=3,
        run_config=run_config,
    ).fit()
    assert set(result.metrics) >= {"fit_time", "done"}
    assert "valid" not in result.metrics and "cv" not in result.metrics
    assert SklearnTrainer.get_model(result.checkpoint).cluster_centers_.shape == (3, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"datasets": {"valid": "x"}}, "'train'"),
        ({"datasets": {"train": [{"y": 1}], "cv": [{"y": 1}]}}, "'cv' is reserved|named 'cv'"),
        ({"scaling_config": ScalingConfig(num_workers=2)}, "not allowed to be updated"),
        (
            {
                "scaling_config": ScalingConfig(trainer_resources={"CPU": 1, "GPU": 1}),
                "cv": 3,
                "parallelize_cv": True,
            },
            "parallelize_cv",
        ),
        ({"parallelize_cv": "yes"}, "parallelize_cv"),
        ({"label_column": "target"}, "has no such column"),
        ({"params": {"alpah": 2.0}}, "alpah"),
        ({"resume_from_checkpoint": phalanx.Checkpoint("/nonexistent")}, "resume_from"),
        ({"return_train_score_cv": 1}, "return_train_score_cv"),
    ],
)
def test_mistakes_fail_at_construction(kwargs, match):
    arguments = {"label_column": "y", "datasets": {"train": [{"x": 1.0, "y": 2.0}]}, **kwargs}
    with pytest.raises(ConfigError, match=match):
        SklearnTrainer(Ridge(), **arguments)
