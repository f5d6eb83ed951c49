"""phalanx.torch without worker processes: configs, environment rules, GPU assignment, checkpoints."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field

import pytest
import torch

import phalanx
import phalanx.torch as ptorch
from phalanx._devices import device_indices
from phalanx._internal.engines.base import WorkerMetadata
from phalanx._internal.worker_group.ranks import RankInfo, assign_ranks
from phalanx.torch import TorchCheckpoint, TorchConfig, TorchTrainer
from phalanx.torch._backend import TorchBackend, _check_one_gpu_per_nccl_rank, resolve_backend
from phalanx.torch._environment import (
    cpu_share,
    loopback_interface,
    master_address,
    shared_visible_devices,
    torchrun_env,
)

# -- API surface -----------------------------------------------------------------------------


def test_public_names_match_ray_train_torch():
    assert sorted(ptorch.__all__) == sorted(
        [
            "TorchTrainer",
            "TorchPredictor",  # AIR-era ray.train.torch
            "TorchCheckpoint",
            "TorchConfig",
            "accelerate",
            "get_device",
            "get_devices",
            "prepare_model",
            "prepare_optimizer",
            "prepare_data_loader",
            "backward",
            "enable_reproducibility",
            "save_state",  # phalanx's own: async checkpoints from a snapshot (README)
            "load_state",
        ]
    )
    for name in ptorch.__all__:
        assert getattr(ptorch, name) is not None


def test_torch_config_defaults_match_ray():
    config = TorchConfig()
    assert (config.backend, config.init_method, config.timeout_s) == (None, "env", 1800)
    assert config.backend_cls is TorchBackend
    assert config.to_dict() == {"backend": None, "init_method": "env", "timeout_s": 1800}


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"init_method": "file"}, "init_method"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": "30"}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"backend": ""}, "backend"),
        ({"backend": 3}, "backend"),
    ],
)
def test_torch_config_rejects_bad_values_naming_the_field(kwargs, field_name):
    with pytest.raises(phalanx.ConfigError, match=f"TorchConfig\\({field_name}="):
        TorchConfig(**kwargs)


def test_trainer_takes_torch_config_and_rejects_other_configs():
    trainer = TorchTrainer(lambda: None, torch_config=TorchConfig(backend="gloo"))
    assert trainer.backend_config == TorchConfig(backend="gloo")
    assert isinstance(TorchTrainer(lambda: None).backend_config, TorchConfig)
    with pytest.raises(phalanx.ConfigError, match=r"phalanx\.torch\.TorchConfig"):
        TorchTrainer(lambda: None, torch_config=phalanx.BackendConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_trainer_refuses_the_thread_engine(num_workers):
    scaling = phalanx.ScalingConfig(num_workers=num_workers, engine="thread")
    with pytest.raises(phalanx.ConfigError, match="cannot run on the thread engine"):
        TorchTrainer(lambda: None, scaling_config=scaling)


def test_the_thread_engine_chosen_by_environment_is_refused_too(storage, monkeypatch):
    monkeypatch.setenv("PHALANX_ENGINE", "thread")
    trainer = TorchTrainer(lambda: None, run_config=phalanx.RunConfig(storage_path=storage))
    with pytest.raises(phalanx.ConfigError, match="cannot run on the thread engine"):
        trainer.fit()


# -- environment rules -----------------------------------------------------------------------


def test_torchrun_env_has_torchrun_and_ray_names():
    env = torchrun_env(
        world_rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, num_nodes=2
    )
    assert env == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "NODE_RANK": "1",
    }


@pytest.mark.parametrize(
    ("resources", "cpus", "local_world", "expected"),
    [
        (None, 16, 4, 4),  # an equal share of the node, like torchrun
        (None, 2, 4, 1),  # never below one thread
        ({"CPU": 3}, 16, 4, 3),  # the worker's CPU resource wins
        ({"CPU": 0.5}, 16, 4, 1),
        ({"GPU": 1}, 8, 2, 4),  # no CPU resource given: the share
    ],
)
def test_cpu_share(resources, cpus, local_world, expected):
    assert cpu_share(resources, cpus, local_world) == expected


def test_master_address_is_loopback_on_one_node():
    assert master_address(["n1", "n1"], "10.0.0.5") == "127.0.0.1"
    assert master_address(["n1", "n2"], "10.0.0.5") == "10.0.0.5"


def test_loopback_interface_is_found(tmp_path):
    for name, flags in [("eth0", "0x1003"), ("lo0", "0x49")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "flags").write_text(flags + "\n")
    assert loopback_interface(str(tmp_path)) == "lo0"
    assert loopback_interface(str(tmp_path / "missing")) == "lo"


# -- GPU assignment (no GPU needed) ----------------------------------------------------------


def test_visible_devices_are_shared_per_node():
    # Ray Train's documented example: two workers with two GPUs each on node 1, one on node 2.
    assert shared_visible_devices(["n1", "n1", "n2"], [(0, 1), (2, 3), (0, 1)]) == [
        "0,1,2,3",
        "0,1,2,3",
        "0,1",
    ]
    assert shared_visible_devices(["n1", "n1"], [(3,), (1,)]) == ["1,3", "1,3"]
    assert shared_visible_devices(["n1"], [()]) == [""]


@pytest.mark.parametrize(
    ("gpu_ids", "visible", "expected"),
    [
        ([2], "2,3", [0]),
        ([3], "2,3", [1]),
        ([2], "0,1,2,3", [2]),
        ([3, 2], "0,1,2,3", [2, 3]),  # lowest id first: get_device() is the lowest
        ([5], None, [5]),  # CUDA_VISIBLE_DEVICES unset: indices are the physical ids
        ([1], " 0, 1 ", [1]),
    ],
)
def test_device_index_is_the_position_in_visible_devices(gpu_ids, visible, expected):
    assert device_indices(gpu_ids, visible) == expected


def test_a_gpu_missing_from_visible_devices_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"assigned GPU\(s\) \[4\].*does not include \[4\]"):
        device_indices([4], "0,1")


@dataclass
class _Handle:
    metadata: WorkerMetadata


@dataclass
class _Worker:
    """The public WorkerInfo a backend reads (phalanx.backend), from metadata and ranks."""

    handle: _Handle
    ranks: RankInfo

    @property
    def metadata(self) -> WorkerMetadata:
        return self.handle.metadata

    world_rank = property(lambda self: self.ranks.world_rank)
    local_rank = property(lambda self: self.ranks.local_rank)
    node_rank = property(lambda self: self.ranks.node_rank)
    local_world_size = property(lambda self: self.ranks.local_world_size)
    host = property(lambda self: self.metadata.host)
    node_id = property(lambda self: self.metadata.node_id)
    pid = property(lambda self: self.metadata.pid)
    gpu_ids = property(lambda self: self.metadata.gpu_ids)


@dataclass
class _Group:
    """Just what TorchBackend.worker_specs reads of a WorkerGroup: no GPUs exist here."""

    workers: list[_Worker]
    spec: object
    engine: object = field(default=None)

    @property
    def scaling_config(self) -> phalanx.ScalingConfig:
        return self.spec.scaling_config  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.workers)


def _gpu_group(nodes: list[str], gpus: list[tuple[int, ...]], resources=None) -> _Group:
    metadata = [
        WorkerMetadata("host-" + n, n, 100 + i, g) for i, (n, g) in enumerate(zip(nodes, gpus))
    ]
    ranks = assign_ranks(metadata)
    workers = sorted(
        (_Worker(_Handle(m), r) for m, r in zip(metadata, ranks)), key=lambda w: w.ranks.world_rank
    )
    scaling = phalanx.ScalingConfig(
        num_workers=len(nodes), use_gpu=True, resources_per_worker=resources
    )

    @dataclass
    class _Spec:
        scaling_config: phalanx.ScalingConfig

    return _Group(workers, _Spec(scaling))


def test_worker_specs_share_gpus_per_node_and_set_torchrun_ranks():
    group = _gpu_group(["a", "b", "a", "b"], [(0,), (0,), (1,), (1,)])
    specs = TorchBackend().worker_specs(group, "nccl", "host-a", 60.0)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0,1", "0,1", "0,1", "0,1"]
    assert [(s.env["RANK"], s.env["LOCAL_RANK"], s.env["GROUP_RANK"]) for s in specs] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    assert all(s.env["GROUP_WORLD_SIZE"] == "2" for s in specs)
    assert [s.open_store_on for s in specs] == ["host-a", None, None, None]
    assert all(s.nccl for s in specs)
    assert all("GLOO_SOCKET_IFNAME" not in s.env_defaults for s in specs)  # several nodes
    # Each worker then picks its own GPU's index within the shared list.
    own = [w.metadata.gpu_ids for w in group.workers]
    assert [device_indices(g, s.env["CUDA_VISIBLE_DEVICES"]) for g, s in zip(own, specs)] == [
        [0],
        [1],
        [0],
        [1],
    ]


def test_worker_specs_without_sharing_keep_each_workers_own_gpus():
    class NoShare(TorchBackend):
        share_cuda_visible_devices = False

    group = _gpu_group(["a", "a"], [(2,), (3,)], resources={"CPU": 4, "GPU": 1})
    specs = NoShare().worker_specs(group, "gloo", "127.0.0.1", 60.0)
    assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in specs)
    assert all(s.cpus_per_worker == 4 for s in specs)
    assert all(not s.nccl for s in specs)
    assert specs[0].env_defaults["GLOO_SOCKET_IFNAME"] == loopback_interface()


@pytest.mark.parametrize(
    ("nodes", "gpus", "backend", "refused"),
    [
        (["a", "a"], [(0,), (0,)], "nccl", True),  # two ranks on one GPU: NCCL's duplicate GPU
        (["a", "a"], [(0,), (0,)], "cpu:gloo,cuda:nccl", True),
        (["a", "a"], [(0,), (0,)], "gloo", False),  # gloo shares a GPU fine (seen on an H200)
        (["a", "b"], [(0,), (0,)], "nccl", False),  # GPU 0 of two different nodes
        (["a", "a"], [(0,), (1,)], "nccl", False),
    ],
)
def test_nccl_ranks_sharing_a_gpu_are_refused_before_the_process_group(
    nodes, gpus, backend, refused
):
    group = _gpu_group(nodes, gpus)
    if not refused:
        _check_one_gpu_per_nccl_rank(group, backend)
        return
    with pytest.raises(
        phalanx.ConfigError, match=r"Ranks \[0, 1\] were given the same GPU \(0"
    ) as e:
        _check_one_gpu_per_nccl_rank(group, backend)
    assert "HINT" in str(e.value) and "backend='gloo'" in str(e.value)


@pytest.mark.parametrize(
    ("backend", "resources", "expected"),
    [
        (None, {"CPU": 1}, "gloo"),
        (None, {"GPU": 1}, "nccl"),
        (None, {"GPU": 0.5, "CPU": 2}, "nccl"),
        ("gloo", {"GPU": 1}, "gloo"),
        ("cpu:gloo,cuda:nccl", {"GPU": 1}, "cpu:gloo,cuda:nccl"),
    ],
)
def test_default_backend_is_nccl_on_gpu_and_gloo_on_cpu(backend, resources, expected):
    assert resolve_backend(TorchConfig(backend=backend), resources) == expected


def test_get_device_outside_a_worker_follows_torch():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert ptorch.get_device().type == expected
    assert [d.type for d in ptorch.get_devices()] == [expected]


# -- TorchCheckpoint -------------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_checkpoint_from_ddp_state_dict_loads_into_the_plain_model():
    torch.manual_seed(0)
    model = _mlp()
    wrapper = torch.nn.Module()
    wrapper.module = model  # keys like DistributedDataParallel's: "module.0.weight", ...
    state = wrapper.state_dict()
    assert next(iter(state)).startswith("module.")
    checkpoint = TorchCheckpoint.from_state_dict(state)
    try:
        assert next(iter(state)).startswith("module.")  # the caller's dict is untouched
        assert isinstance(checkpoint, TorchCheckpoint)
        assert os.listdir(checkpoint.path) == ["model.pt"]
        loaded = checkpoint.get_model(_mlp())
        for a, b in zip(model.state_dict().values(), loaded.state_dict().values()):
            assert torch.equal(a, b)
        with pytest.raises(ValueError, match="pass the model"):
            checkpoint.get_model()
        assert checkpoint.get_preprocessor() is None
    finally:
        _remove(checkpoint)


def test_checkpoint_from_model_returns_the_whole_model():
    model = _mlp()
    checkpoint = TorchCheckpoint.from_model(model, preprocessor={"scale": 2.0})
    try:
        # Before: a silent retry with weights_only=False ran the checkpoint's pickled code.
        with pytest.raises(pickle.UnpicklingError, match=r"HINT: .*get_model\(weights_only=False"):
            checkpoint.get_model()
        loaded = checkpoint.get_model(weights_only=False)  # the user's explicit choice
        x = torch.randn(3, 4)
        assert torch.equal(loaded(x), model(x))
        with pytest.warns(UserWarning, match="ignored"):
            checkpoint.get_model(_mlp(), weights_only=False)
        assert checkpoint.get_preprocessor() == {"scale": 2.0}
    finally:
        _remove(checkpoint)


def test_checkpoint_without_a_model_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="from_state_dict"):
        TorchCheckpoint.from_directory(tmp_path).get_model(_mlp())


def _remove(checkpoint: phalanx.Checkpoint) -> None:
    import shutil

    shutil.rmtree(checkpoint.path, ignore_errors=True)
