"""A sweep's driver for test_restore.py: ``python _sweep_driver.py <storage> run|restore``.

Each trial reports 6 steps with a checkpoint at each (it resumes from its checkpoint), and
appends a line to ``<storage>/finished.txt`` when its loop ends.
"""

from __future__ import annotations

import json
import os
import sys
import time

from phalanx import tune
from phalanx.checkpoint import Checkpoint


def trainable(config):
    storage = config["storage"]
    step = 0
    if checkpoint := tune.get_checkpoint():
        with open(os.path.join(checkpoint.path, "step")) as f:
            step = int(f.read())
    while step < 6:
        step += 1
        time.sleep(config["step_s"])  # the trial's work
        path = os.path.join(storage, "scratch", f"{tune.get_context().get_trial_id()}_{step}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "step"), "w") as f:
            f.write(str(step))
        tune.report({"step": step, "x": config["x"]}, checkpoint=Checkpoint(path))
    with open(os.path.join(storage, "finished.txt"), "a") as f:
        f.write(json.dumps([tune.get_context().get_trial_id(), step]) + "\n")


if __name__ == "__main__":
    storage, mode = sys.argv[1], sys.argv[2]
    path = os.path.join(storage, "sweep")
    if mode == "run":
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"x": tune.grid_search([0, 1, 2, 3]), "storage": storage, "step_s": 0.2},
            tune_config=tune.TuneConfig(max_concurrent_trials=2),
            run_config=tune.RunConfig(name="sweep", storage_path=storage),
        )
    else:
        tuner = tune.Tuner.restore(path, trainable=trainable)
    grid = tuner.fit()
    print(json.dumps([[r.metrics["x"], r.metrics["step"]] for r in grid]))
