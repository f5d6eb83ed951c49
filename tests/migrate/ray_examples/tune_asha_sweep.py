# ruff: noqa  (Ray's doc code as Ray writes it)
# Ray 2.60 docs, "Getting Started with Ray Tune" / "ASHA" (doc/source/tune/), in Ray's own
# form: a function trainable reporting with tune.report, random search, ASHAScheduler with its
# own metric and mode. A quadratic instead of an MNIST model, 8 samples of 8 steps.
from ray import tune
from ray.tune.schedulers import ASHAScheduler


def objective(config):
    for step in range(1, 9):
        mean_loss = (config["a"] - 0.5) ** 2 + config["b"] / step
        tune.report({"mean_loss": mean_loss})


search_space = {
    "a": tune.uniform(0, 1),
    "b": tune.choice([0.1, 1.0, 10.0]),
}
scheduler = ASHAScheduler(
    metric="mean_loss", mode="min", max_t=8, grace_period=1, reduction_factor=2
)
tuner = tune.Tuner(
    objective,
    param_space=search_space,
    tune_config=tune.TuneConfig(num_samples=8, scheduler=scheduler),
)
results = tuner.fit()

best = results.get_best_result(metric="mean_loss", mode="min")
df = results.get_dataframe()
assert len(results) == 8 and not results.errors
assert df["training_iteration"].min() < 8  # ASHA stopped some trials early
assert best.metrics["mean_loss"] == df["mean_loss"].min()
print("best config:", best.config, "ROUNDTRIP-OK")
