"""Search spaces and search algorithms: Ray Tune's semantics for grid_search x num_samples,
random sampling within bounds, Optuna's TPE converging, and clear errors for bad input."""

from __future__ import annotations

import random

import pytest

from phalanx import tune
from phalanx.errors import ConfigError
from phalanx.tune.schedulers import ASHAScheduler, MedianStoppingRule, PopulationBasedTraining
from phalanx.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from phalanx.tune.search._default import default_searcher
from phalanx.tune.search.optuna import OptunaSearch


def _all(searcher: Searcher, space: dict, num_samples: int = 1) -> list[dict]:
    searcher.set_search_properties(None, None, space, num_samples=num_samples)
    configs = []
    while isinstance(config := searcher.suggest(f"t{len(configs)}"), dict):
        configs.append(config)
    return configs


def test_grid_search_times_num_samples_in_rays_order_with_other_domains_sampled():
    space = {"lr": tune.grid_search([0.1, 0.01]), "bs": tune.choice([8, 16]), "fixed": 3}
    configs = _all(BasicVariantGenerator(random_state=0), space, num_samples=3)
    assert [c["lr"] for c in configs] == [0.1, 0.01] * 3
    assert all(c["bs"] in (8, 16) and c["fixed"] == 3 for c in configs)


def test_domains_sample_within_their_bounds_and_sample_from_sees_the_config():
    rng = random.Random(0)
    assert all(0 <= tune.uniform(0, 1).sample(rng) < 1 for _ in range(50))
    assert all(1e-4 <= tune.loguniform(1e-4, 1e-1).sample(rng) <= 1e-1 for _ in range(50))
    assert all(tune.randint(2, 5).sample(rng) in (2, 3, 4) for _ in range(50))
    assert all(tune.quniform(0, 1, 0.25).sample(rng) in (0, 0.25, 0.5, 0.75, 1) for _ in range(50))
    space = {"a": tune.randint(1, 10), "b": tune.sample_from(lambda spec: spec.config.a * 2)}
    for config in _all(BasicVariantGenerator(), space, num_samples=5):
        assert config["b"] == 2 * config["a"]


def test_bad_spaces_and_configs_say_what_to_change():
    with pytest.raises(ConfigError, match="mode"):
        tune.TuneConfig(metric="loss", mode="minimize")
    with pytest.raises(ConfigError, match="num_samples"):
        tune.TuneConfig(num_samples=0)
    with pytest.raises(ConfigError, match="max_concurrent_trials"):
        tune.TuneConfig(max_concurrent_trials=0)
    with pytest.raises(ConfigError, match="reduction_factor"):
        ASHAScheduler(reduction_factor=1)
    with pytest.raises(ConfigError, match="hyperparam_mutations"):
        PopulationBasedTraining()
    with pytest.raises(ConfigError, match="max_concurrent"):
        ConcurrencyLimiter(BasicVariantGenerator(), max_concurrent=0)
    with pytest.raises(ConfigError, match="HINT"):
        tune.report({"loss": 1.0})  # outside a trial
    with pytest.raises(ConfigError, match="with_resources"):
        tune.with_resources(lambda c: None, "2 cpus")


def test_default_search_is_tpe_for_domains_with_a_metric_else_grid_and_random():
    assert isinstance(default_searcher({"x": tune.uniform(0, 1)}, "loss", "min"), OptunaSearch)
    grid = {"x": tune.grid_search([1, 2])}
    assert isinstance(default_searcher(grid, "loss", "min"), BasicVariantGenerator)
    assert isinstance(
        default_searcher({"x": tune.uniform(0, 1)}, None, None), BasicVariantGenerator
    )


def test_optuna_tpe_converges_on_a_quadratic():
    searcher = OptunaSearch(seed=0)
    searcher.set_search_properties("loss", "min", {"x": tune.uniform(-10, 10)})
    best = float("inf")
    for index in range(40):
        config = searcher.suggest(f"t{index}")
        assert isinstance(config, dict)
        loss = (config["x"] - 3) ** 2
        best = min(best, loss)
        searcher.on_trial_complete(f"t{index}", {"loss": loss, "training_iteration": 1})
    assert best < 0.05


def test_asha_stops_the_trials_behind_at_each_rung():
    asha = ASHAScheduler(metric="loss", mode="min", max_t=4, grace_period=1, reduction_factor=2)

    class T:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    trials = [T(str(i)) for i in range(4)]
    for trial in trials:
        asha.on_trial_add(None, trial)
    decisions = [
        asha.on_trial_result(None, t, {"training_iteration": 1, "loss": loss})
        for t, loss in zip(trials, [1.0, 2.0, 0.5, 3.0])
    ]
    assert decisions == ["CONTINUE", "STOP", "CONTINUE", "STOP"]
    assert asha.on_trial_result(None, trials[0], {"training_iteration": 4, "loss": 0.1}) == "STOP"


def test_median_rule_stops_a_trial_worse_than_the_others_median():
    rule = MedianStoppingRule(
        time_attr="training_iteration", metric="acc", mode="max", grace_period=1,
        min_samples_required=2,
    )  # fmt: skip

    class T:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    a, b, c = T("a"), T("b"), T("c")
    for step in (1, 2):
        assert rule.on_trial_result(None, a, {"training_iteration": step, "acc": 0.9}) == "CONTINUE"
        assert rule.on_trial_result(None, b, {"training_iteration": step, "acc": 0.8}) == "CONTINUE"
    assert rule.on_trial_result(None, c, {"training_iteration": 1, "acc": 0.1}) == "STOP"
