"""A DDP job with one rank stuck in user code: the hang report names that rank as the cause.

The other ranks wait in the gradient allreduce DDP runs inside ``loss.backward()`` (their
Python stack ends in the autograd engine, ``_engine_run_backward``, not in torch.distributed),
so the roll call must recognise that wait as a collective. Each attempt of one ``fit()`` is a
trial (``max_failures`` retries), and the stuck rank moves with the attempt, so every rank is
the culprit in some trial.
"""

from __future__ import annotations

import re

import pytest

import phalanx as train
from phalanx import FailureConfig, HangError, RunConfig, ScalingConfig

torch = pytest.importorskip("torch")
from phalanx.torch import TorchTrainer, prepare_model  # noqa: E402

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 1.5


def _warm_torch() -> None:
    """torch imports hundreds of modules lazily on the first optimizer step (seconds, longer than
    the hang timeout): done once here, the forked workers inherit them."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 1)).sum().backward()
    optimizer.step()


_warm_torch()


def ddp_loop(config):
    import threading

    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    stuck = attempt % ctx.get_world_size()
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    for step in range(1000):
        if rank == stuck and step == 2:
            threading.Event().wait()  # this rank stops in user code; the others reach backward
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP's allreduce runs in here
        optimizer.step()
        train.report({"step": step, "trial": attempt})


@pytest.mark.parametrize("workers", [2, 4])
def test_the_stuck_rank_is_named_in_every_trial(storage, workers):
    trials = workers  # each rank the culprit once (bench/anatomy.py repeats trials)
    with pytest.raises(HangError) as info:
        TorchTrainer(
            ddp_loop,
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(
                name=f"ddp{workers}",
                storage_path=storage,
                failure_config=FailureConfig(
                    max_failures=trials - 1, hang_timeout_s=HANG_TIMEOUT_S
                ),
            ),
        ).fit()
    errors = info.value.result.attempt_errors
    assert len(errors) == trials
    for attempt, error in enumerate(errors):
        stuck = attempt % workers
        waiting = ", ".join(str(r) for r in range(workers) if r != stuck)
        named = re.search(r"-> rank ([\d, ]+) is not where the others are\. (.*)", error or "")
        assert named, f"trial {attempt}: no rank named\n{error}"
        assert named.group(1) == str(stuck), f"trial {attempt}: expected rank {stuck}\n{error}"
        assert named.group(2) == f"Rank {waiting} wait in a collective for it."
