"""TorchTrainer on real local worker processes with gloo on 127.0.0.1."""

from __future__ import annotations

import io
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import phalanx as train
from phalanx.torch import (
    TorchConfig,
    TorchTrainer,
    accelerate,
    backward,
    enable_reproducibility,
    get_device,
    prepare_data_loader,
    prepare_model,
    prepare_optimizer,
)
from phalanx.torch._backend import TorchBackend

pytestmark = pytest.mark.slow

TORCHRUN_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "ACCELERATE_TORCH_DEVICE",
)


def _fit(fn: Any, storage: str, num_workers: int = 2, **kwargs: Any) -> train.Result:
    scaling = kwargs.pop("scaling_config", None) or train.ScalingConfig(num_workers=num_workers)
    run_config = kwargs.pop("run_config", None) or train.RunConfig(storage_path=storage)
    return TorchTrainer(fn, scaling_config=scaling, run_config=run_config, **kwargs).fit()


def _rank_metrics(result: train.Result) -> dict[int, dict[str, Any]]:
    """The last report of each rank."""
    df = result.all_ranks_metrics_dataframe
    return {int(row["rank"]): row.to_dict() for _, row in df.iterrows()}


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(32, 1, generator=gen)


# -- the environment a torchrun user expects -------------------------------------------------


def _report_environment() -> None:
    import torch.distributed as dist

    sockets = psutil.Process().net_connections("tcp")
    train.report(
        {
            "env": {k: os.environ.get(k) for k in TORCHRUN_KEYS},
            "threads": torch.get_num_threads(),
            "dist": [dist.get_rank(), dist.get_world_size(), dist.get_backend()],
            "listening": sorted({c.laddr.ip for c in sockets if c.status == psutil.CONN_LISTEN}),
            "device": str(get_device()),
        }
    )


def test_workers_get_torchrun_env_a_process_group_and_loopback_only_sockets(storage, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    ranks = _rank_metrics(_fit(_report_environment, storage))
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    for rank, m in ranks.items():
        assert m["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": ranks[0]["env"]["MASTER_PORT"],
            "OMP_NUM_THREADS": share,
            "ACCELERATE_TORCH_DEVICE": "cpu",
        }
        assert m["threads"] == int(share)
        assert m["dist"] == [rank, 2, "gloo"]
        assert m["device"] == "cpu"
        assert set(m["listening"]) <= {"127.0.0.1"}  # the store and gloo: loopback only
    assert ranks[0]["listening"] == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("resources", "user_omp", "expected"),
    [
        (None, None, str(len(os.sched_getaffinity(0)))),  # one worker: the whole machine
        ({"CPU": 1}, None, "1"),  # the worker's CPU resource
        (None, "3", "3"),  # the user's own setting stands
    ],
)
def test_thread_default_is_the_workers_cpu_share(
    storage, monkeypatch, resources, user_omp, expected
):
    if user_omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user_omp)
    scaling = train.ScalingConfig(num_workers=1, resources_per_worker=resources)
    m = _rank_metrics(_fit(_report_environment, storage, scaling_config=scaling))[0]
    assert m["env"]["OMP_NUM_THREADS"] == expected
    if user_omp is None:
        assert m["threads"] == int(expected)


# -- data parallelism is real ----------------------------------------------------------------


def _train_shard(config: dict[str, Any]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x, y = _global_batch()
    rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    torch.manual_seed(0)
    model = prepare_model(_net(), parallel_strategy=config["strategy"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(config["steps"]):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if isinstance(model, FSDP):
        with FSDP.summon_full_params(model):
            params = [p.detach().clone() for p in model.module.parameters()]
    else:
        params = [p.detach().clone() for p in model.module.parameters()]
    torch.save(
        {"losses": losses, "params": params, "type": type(model).__name__},
        os.path.join(config["out"], f"rank{rank}.pt"),
    )


def _reference(steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """One process, the whole global batch: what averaged gradients must reproduce."""
    x, y = _global_batch()
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


@pytest.mark.parametrize(
    ("strategy", "init_method", "wrapper"),
    [
        ("ddp", "env", "DistributedDataParallel"),
        ("ddp", "tcp", "DistributedDataParallel"),
        ("fsdp", "env", "FullyShardedDataParallel"),  # FSDP works on CPU with gloo in torch 2.13
    ],
)
def test_two_workers_match_one_process_on_the_global_batch(
    storage, tmp_path, monkeypatch, strategy, init_method, wrapper
):
    # torch's first optimizer step in this process sets this variable; keep it test-local.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    steps = 5
    _fit(
        _train_shard,
        storage,
        train_loop_config={"strategy": strategy, "steps": steps, "out": str(tmp_path)},
        torch_config=TorchConfig(init_method=init_method),
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["type"] == r1["type"] == wrapper
    for p0, p1 in zip(r0["params"], r1["params"], strict=True):
        assert torch.equal(p0, p1)  # every rank applied the same averaged gradient
    ref_losses, ref_params = _reference(steps)
    mean_losses = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"])]
    assert mean_losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ref_losses[-1] < ref_losses[0]
    for p, ref in zip(r0["params"], ref_params, strict=True):
        torch.testing.assert_close(p, ref, rtol=1e-5, atol=1e-6)


def _sample_indices(config: dict[str, Any]) -> None:
    dataset = TensorDataset(torch.arange(config["n"]))
    shuffled = prepare_data_loader(DataLoader(dataset, batch_size=10, shuffle=True))
    in_order = prepare_data_loader(DataLoader(dataset, batch_size=10, shuffle=False))
    passes = []
    for i in range(3):
        if i == 2:
            shuffled.sampler.set_epoch(0)  # the user's own call wins
        passes.append([int(v) for (batch,) in shuffled for v in batch])
    train.report(
        {
            "passes": passes,
            "in_order": [int(v) for (batch,) in in_order for v in batch],
            "sampler": type(shuffled.sampler).__mro__[1].__name__,
            "is_loader": isinstance(shuffled, DataLoader),
            "len": len(shuffled),
        }
    )


def test_distributed_sampler_shards_are_disjoint_and_reshuffled_each_epoch(storage):
    n = 100
    ranks = _rank_metrics(_fit(_sample_indices, storage, train_loop_config={"n": n}))
    r0, r1 = ranks[0], ranks[1]
    assert r0["sampler"] == r1["sampler"] == "DistributedSampler"
    assert r0["is_loader"] and r0["len"] == 5
    for a, b in zip(r0["passes"], r1["passes"]):
        assert len(a) == len(b) == n // 2
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(n))
    assert r0["passes"][0] != r0["passes"][1]  # set_epoch advanced on its own
    assert r0["passes"][2] == r0["passes"][0]  # set_epoch(0) by the user was honoured
    assert r0["in_order"] == list(range(0, n, 2))  # shuffle=False kept
    assert r1["in_order"] == list(range(1, n, 2))


# -- checkpoints and resume ------------------------------------------------------------------


def _train_epochs(config: dict[str, Any]) -> None:
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(_net())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(256, 8, generator=gen)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = prepare_data_loader(DataLoader(dataset, batch_size=16, shuffle=True))
    for epoch in range(start, config["epochs"]):
        if epoch == config.get("fail_at") and ctx.get_attempt() == 0:
            raise RuntimeError("injected failure")
        loader.sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
        with tempfile.TemporaryDirectory() as d:
            saved = None
            if rank == 0:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "epoch": epoch}, os.path.join(d, "state.pt"))
                saved = train.Checkpoint.from_directory(d)
            train.report({"epoch": epoch, "loss": total, "start": start}, checkpoint=saved)


def _loss_by_epoch(result: train.Result) -> dict[int, float]:
    df = result.metrics_dataframe
    return {int(e): float(loss) for e, loss in zip(df["epoch"], df["loss"])}


def test_resume_continues_the_loss_curve(storage):
    epochs = 6
    config = {"epochs": epochs}
    full = _fit(
        _train_epochs,
        storage,
        train_loop_config=config,
        run_config=train.RunConfig(name="full", storage_path=storage),
    )
    expected = _loss_by_epoch(full)
    assert sorted(expected) == list(range(epochs))

    retried = _fit(
        _train_epochs,
        storage,
        train_loop_config={**config, "fail_at": 3},
        run_config=train.RunConfig(
            name="retried",
            storage_path=storage,
            failure_config=train.FailureConfig(max_failures=1),
        ),
    )
    assert retried.attempts == 2
    assert retried.metrics["start"] > 0  # the second attempt began from a checkpoint
    assert _loss_by_epoch(retried) == pytest.approx(expected, rel=1e-6)

    epoch2 = next(c for c, m in full.best_checkpoints if m["epoch"] == 2)
    resumed = _fit(
        _train_epochs,
        storage,
        train_loop_config=config,
        resume_from_checkpoint=epoch2,
        run_config=train.RunConfig(name="resumed", storage_path=storage),
    )
    got = _loss_by_epoch(resumed)
    assert sorted(got) == [3, 4, 5]
    assert got == pytest.approx({e: expected[e] for e in got}, rel=1e-6)


# -- a rank that never joins ---------------------------------------------------------------


def _busy_elsewhere() -> None:
    time.sleep(600)


class _Rank1BusyBackend(TorchBackend):
    """Rank 1 is stuck in other work when the process group forms, as after a slow import."""

    def on_start(self, worker_group: Any, backend_config: train.BackendConfig) -> None:
        worker_group.workers[1].handle.execute(_busy_elsewhere)
        super().on_start(worker_group, backend_config)


@dataclass
class _Rank1BusyConfig(TorchConfig):
    @property
    def backend_cls(self) -> type[TorchBackend]:
        return _Rank1BusyBackend


def test_a_rank_that_never_joins_is_named_within_the_timeout(storage):
    timeout_s = 2.0
    start = time.monotonic()
    with pytest.raises(train.WorkerGroupError) as info:
        _fit(lambda: None, storage, torch_config=_Rank1BusyConfig(timeout_s=timeout_s))
    elapsed = time.monotonic() - start
    assert elapsed < timeout_s + 4.0
    error = info.value
    assert list(error.worker_failures) == [1]
    assert error.worker_failures[1].kind == "hang"
    message = str(error)
    assert "[rank 1]" in message
    assert "rank 1 never joined the torch process group within 2 s" in message
    assert "in _busy_elsewhere" in message  # the straggler's stack says where it was
    assert "Root cause (earliest failure), rank 1" in message


# -- one worker: the helpers without a process group in the way --------------------------------


def _single_worker_helpers() -> None:
    enable_reproducibility(7)
    accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(4, 2))
    optimizer = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    out = model(torch.randn(3, 4))
    backward(out.float().sum())
    optimizer.step()
    try:
        accelerate(amp=False)
        late_accelerate = "accepted"
    except RuntimeError as exc:
        late_accelerate = str(exc)
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(6)), batch_size=2))
    buffer = io.BytesIO()
    torch.save(model, buffer)  # a model prepared for AMP still pickles
    train.report(
        {
            "model": type(model).__name__,
            "dtype": str(out.dtype),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "sampler": type(loader.sampler).__name__,
            "batches": [batch.tolist() for (batch,) in loader],
            "late_accelerate": late_accelerate,
        }
    )


def test_one_worker_helpers_amp_and_reproducibility(storage):
    m = _fit(_single_worker_helpers, storage, num_workers=1).metrics
    assert m["model"] == "Linear"  # one worker: nothing to wrap
    assert m["dtype"] == "torch.bfloat16"  # CPU autocast
    assert m["deterministic"] is True
    assert m["cublas"] == ":4096:8"
    assert m["sampler"] == "SequentialSampler"
    assert m["batches"] == [[0, 1], [2, 3], [4, 5]]
    assert "before any prepare_* call" in m["late_accelerate"]


def _amp_run() -> None:
    accelerate(amp=True)  # refused if an earlier run's prepare_model state were still here
    model = prepare_model(torch.nn.Linear(4, 2))
    try:
        accelerate(amp=False)
        late = "accepted"
    except RuntimeError as exc:
        late = str(exc)
    train.report({"dtype": str(model(torch.randn(3, 4)).dtype), "late_accelerate": late})


def test_amp_state_belongs_to_one_run_not_to_the_process(storage):
    """num_workers=0 runs the function in this process: neither the next such run nor a worker
    forked from this process afterwards may see the first run's accelerate/prepare state."""
    for num_workers in (0, 0, 1):
        m = _fit(_amp_run, storage, num_workers=num_workers).metrics
        assert m["dtype"] == "torch.bfloat16", num_workers
        assert "before any prepare_* call" in m["late_accelerate"], num_workers


# -- workers forked after the driver used OpenMP -------------------------------------------------


def _parallel_matmul() -> None:
    a = torch.randn(512, 512)
    train.report({"threads": torch.get_num_threads(), "sum": float((a @ a).sum())})


@pytest.mark.timeout(60)
def test_workers_do_not_hang_after_the_driver_ran_parallel_torch_code(storage, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", storage)
    a = torch.randn(512, 512)
    (a @ a).sum()  # starts libgomp's thread pool in this process
    m = _fit(_parallel_matmul, storage, num_workers=1).metrics
    assert m["threads"] == len(os.sched_getaffinity(0))
