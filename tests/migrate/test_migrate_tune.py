"""`phalanx migrate` ports Ray Tune sweeps over Train runs to phalanx.tune (Ray 2.60's V2 form
and the AIR form), and lists what phalanx.tune lacks."""

from __future__ import annotations

import textwrap

from phalanx.migrate import migrate_source


def _migrate(code: str):
    return migrate_source(textwrap.dedent(code).lstrip())


def test_tuner_search_spaces_schedulers_searchers_and_the_train_callback_are_rewritten():
    migrated = _migrate(
        """
        import ray.tune
        from ray import tune
        from ray.tune import Tuner, TuneConfig
        from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
        from ray.tune.search.optuna import OptunaSearch
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.integration.ray_train import TuneReportCallback

        tuner = Tuner(
            f,
            param_space={"lr": tune.loguniform(1e-4, 1e-1), "bs": ray.tune.grid_search([8])},
            tune_config=TuneConfig(scheduler=ASHAScheduler(), search_alg=OptunaSearch()),
            run_config=ray.tune.RunConfig(name="x"),
        )
        tune.report({"a": 1})
        """
    )
    assert not migrated.attention, migrated.attention
    assert "ray" not in migrated.code.replace("ray_train", "")
    for line in (
        "import phalanx.tune",
        "from phalanx import tune",
        "from phalanx.tune import Tuner, TuneConfig",
        "from phalanx.tune.schedulers import ASHAScheduler, PopulationBasedTraining",
        "from phalanx.tune.search.optuna import OptunaSearch",
        "from phalanx.tune.integration.ray_train import TuneReportCallback",
        '"bs": phalanx.tune.grid_search([8])',
        'run_config=phalanx.tune.RunConfig(name="x")',
    ):
        assert line in migrated.code, migrated.code


def test_tune_names_phalanx_lacks_are_left_and_listed():
    migrated = _migrate(
        """
        from ray import tune
        from ray.tune.schedulers.pb2 import PB2
        analysis = tune.run(f)
        """
    )
    assert [(item.line, item.name) for item in migrated.attention] == [
        (2, "ray.tune.schedulers.pb2.PB2"),
        (3, "ray.tune.run"),
    ]
    assert "from ray import tune" in migrated.code  # tune.run is still Ray's
