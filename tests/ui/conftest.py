"""Real runs for the viewer's tests: made by fit() on the thread engine in a package's storage.

The browser tests share one chromium (and Playwright's driver) for their module: this
directory's ``no_leaks`` lets those outlive a test, and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _leaks import any_child
from _leaks import no_leaks as check_no_leaks

import phalanx as train
from phalanx import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from phalanx.errors import TrainingFailedError

pytest.importorskip("starlette")


BROWSER_PROCESSES = ("chromium", "chrome", "node")  # node: Playwright's driver


def browser_tolerant(name: str) -> bool:
    return any_child(name) and not name.startswith(BROWSER_PROCESSES)


@pytest.fixture(autouse=True)
def no_leaks(isolated_home: str) -> Iterator[None]:
    with check_no_leaks(browser_tolerant):
        yield


def make_runs(storage: str, tmp: str) -> None:
    """``good`` and ``other`` (lr 0.1 and 0.2: 12 steps of loss and accuracy, a checkpoint every
    4, one restart after a failure in ``good``), ``broken`` (fails: ZeroDivisionError)."""

    def loop(config):
        ctx = train.get_context()
        start = 0
        if train.get_checkpoint() is not None:
            with train.get_checkpoint().as_directory() as d, open(f"{d}/step") as f:
                start = int(f.read())
        for step in range(start, 12):
            metrics = {"loss": 1.0 / (1 + step * config["lr"]), "accuracy": step / 12}
            if config.get("crash_at") == step and ctx.get_world_rank() == 0 and start == 0:
                raise RuntimeError("lost the node (on purpose)")
            if step % 4 == 3:
                path = f"{tmp}/{config['lr']}-{step}-{start}"
                os.makedirs(path, exist_ok=True)
                with open(f"{path}/step", "w") as f:
                    f.write(str(step + 1))
                train.report(metrics, checkpoint=train.Checkpoint.from_directory(path))
            else:
                train.report(metrics)

    for name, config, failures in (
        ("good", {"lr": 0.1, "crash_at": 9}, 1),
        ("other", {"lr": 0.2}, 0),
    ):
        DataParallelTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(
                name=name,
                storage_path=storage,
                verbose=0,
                failure_config=FailureConfig(max_failures=failures),
            ),
        ).fit()

    def broken(config):
        train.report({"loss": 1.0})
        return 1 / 0

    with pytest.raises(TrainingFailedError):
        DataParallelTrainer(
            broken,
            scaling_config=ScalingConfig(num_workers=1, engine="thread"),
            run_config=RunConfig(name="broken", storage_path=storage, verbose=0),
        ).fit()


@pytest.fixture(scope="package")
def runs(tmp_path_factory):
    """A storage path holding good, other and broken."""
    base = tmp_path_factory.mktemp("ui")
    storage = base / "runs"
    make_runs(str(storage), str(base))
    return storage
