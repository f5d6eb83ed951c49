"""The replica agreement check: one flipped bit in one of 3 DDP replicas is named before the next
checkpoint commits, the run goes back to its last checkpoint, and it ends bitwise equal to a run
restarted from that checkpoint without the flip.

Each trial flips a mantissa bit of a random parameter on a random rank after a random step
(seeded: the trial number; an exponent bit can make the value inf, and the next all-reduce then
spreads NaN to every replica alike: a NaN loss, not a divergence). CI runs 2 trials;
``bench/anatomy.py`` runs 12 (4 per rep).
Compared with a restarted run, not an uninterrupted one: with 3 or more gloo ranks a re-created
DDP (new bucket order) changes the all-reduce's rounding from its first step.
"""

from __future__ import annotations

import random

import pytest

import phalanx as train
from phalanx import Checkpoint, FailureConfig, RunConfig, ScalingConfig

torch = pytest.importorskip("torch")
from phalanx.torch import TorchTrainer, load_state, prepare_model, save_state  # noqa: E402
from phalanx.torch._replicas import checksum  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 12
EVERY = 4  # a checkpoint after steps 3, 7, 11


def replicas_loop(config):
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = {"model": model, "optimizer": optimizer, "step": -1}
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        load_state(checkpoint, state)
    started_from = checkpoint.path if checkpoint is not None else None
    for step in range(state["step"] + 1, STEPS):
        data = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(4, 6, generator=data), torch.randn(4, 1, generator=data)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        flip = config.get("flip")
        if flip and ctx.get_attempt() == 0 and step == flip["step"] and rank == flip["rank"]:
            with torch.no_grad():  # one bit of one parameter, as a bad memory cell would
                param = list(model.parameters())[flip["param"]]
                param.view(-1).view(torch.int32)[flip["index"]] ^= 1 << flip["bit"]
        state["step"] = step
        saved = save_state(state, blocking=True) if (step + 1) % EVERY == 0 else None
        train.report({"step": step}, checkpoint=saved)
    return {"from": started_from, "checksum": checksum(model.parameters())}


def fit(storage, name, config, checkpoint=None):
    return TorchTrainer(
        replicas_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(
            name=name, storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
        resume_from_checkpoint=checkpoint,
    ).fit()


@pytest.mark.parametrize("trial", [0, 1])
def test_a_flipped_bit_is_named_before_it_is_checkpointed_and_the_run_recovers(storage, trial):
    pick = random.Random(trial)
    # before the last checkpoint, so that a checkpoint round follows it
    flip = {
        "step": pick.randrange(STEPS - EVERY),
        "rank": pick.randrange(3),
        "param": pick.randrange(4),
        "index": 0,
        "bit": pick.randrange(23),
    }
    flipped = fit(storage, "flipped", {"flip": flip})
    assert flipped.error is None, flipped.error
    assert flipped.attempts == 2
    message = flipped.attempt_errors[0]
    assert message is not None
    assert f"replicas diverged in round {(flip['step'] // EVERY + 1) * EVERY - 1}" in message
    others = ", ".join(str(r) for r in range(3) if r != flip["rank"])
    assert f"rank {flip['rank']} on host " in message and f"from ranks {others}" in message
    # the round of the flip's checkpoint never committed: the retry started from the one before
    restarted_from = flipped.return_value["from"]
    last_good = flip["step"] // EVERY * EVERY - 1
    if last_good < 0:
        assert restarted_from is None
    else:
        assert restarted_from is not None and restarted_from.endswith(f"checkpoint_{last_good:06d}")
    reference = fit(
        storage,
        "reference",
        {},
        Checkpoint(restarted_from) if restarted_from is not None else None,
    )
    assert reference.error is None and reference.attempts == 1
    assert flipped.return_value["checksum"] == reference.return_value["checksum"]
