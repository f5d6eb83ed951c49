# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Hyperparameter Tuning with Ray Tune" (doc/source/train/doc_code/
# train_tune_interop.py), in Ray's own form: a Tune trial's driver function fits a TorchTrainer
# that reports to Tune with TuneReportCallback. Synthetic data: a linear model on random
# tensors instead of a real dataset, 2 trials of 1 worker, 3 epochs, CPU.
import torch

import ray.tune
import ray.train
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback


def train_fn_per_worker(train_loop_config: dict):
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=train_loop_config["lr"])
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    for epoch in range(train_loop_config["num_epochs"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ray.train.report({"loss": loss.item(), "epoch": epoch})


def train_driver_fn(config: dict):
    # Hyperparameters for this trial.
    num_workers = config["num_workers"]
    train_loop_config = config["train_loop_config"]

    trainer = TorchTrainer(
        train_fn_per_worker,
        train_loop_config=train_loop_config,
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
        run_config=ray.train.RunConfig(
            name=f"train-trial_id={ray.tune.get_context().get_trial_id()}",
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


tuner = ray.tune.Tuner(
    train_driver_fn,
    param_space={
        "num_workers": 1,
        "train_loop_config": {
            "lr": ray.tune.grid_search([1e-3, 1e-1]),
            "num_epochs": 3,
        },
    },
    tune_config=ray.tune.TuneConfig(max_concurrent_trials=2),
    run_config=ray.tune.RunConfig(name="train_tune_interop"),
)
results = tuner.fit()

best = results.get_best_result(metric="loss", mode="min")
assert len(results) == 2 and not results.errors, results.errors
assert best.config["train_loop_config"]["lr"] == 1e-1, best.config
assert best.metrics["epoch"] == 2
print("best config:", best.config, "ROUNDTRIP-OK")
