"""JaxConfig, the per-rank plan and the import contract, without worker processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import phalanx as train
from phalanx.errors import ConfigError
from phalanx.jax import JaxConfig, JaxTrainer
from phalanx.jax._backend import worker_specs


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"use_gpu": "yes"}, "use_gpu='yes'"),
        ({"use_tpu": 1}, "use_tpu=1"),
        ({"use_gpu": True, "use_tpu": True}, "one platform"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"timeout_s": True}, "timeout_s=True"),
    ],
)
def test_bad_configs_are_refused_when_built(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        JaxConfig(**kwargs)


def test_the_default_config_follows_the_scaling_config_as_in_ray():
    trainer = JaxTrainer(lambda: None, scaling_config=train.ScalingConfig(num_workers=2))
    assert trainer.backend_config == JaxConfig()
    gpu = JaxTrainer(lambda: None, scaling_config=train.ScalingConfig(num_workers=2, use_gpu=True))
    assert gpu.backend_config == JaxConfig(use_gpu=True)
    assert JaxConfig(use_gpu=True).to_dict() == {
        "use_tpu": False,
        "use_gpu": True,
        "timeout_s": 300,
    }


def test_a_ray_config_or_the_thread_engine_is_refused():
    with pytest.raises(ConfigError, match=r"phalanx\.jax\.JaxConfig"):
        JaxTrainer(lambda: None, jax_config=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="thread engine"):
        JaxTrainer(lambda: None, scaling_config=train.ScalingConfig(engine="thread"))


def test_one_process_per_gpu_and_rank_0_binds_the_coordinator():
    specs = worker_specs(JaxConfig(use_gpu=True), [(0,), (1,), (0,)], "10.0.0.1:1234")
    assert [s.platform for s in specs] == ["cuda"] * 3
    assert [s.local_device_ids for s in specs] == [(0,), (0,), (0,)]  # each sees only its GPU
    assert [s.bind_address for s in specs] == ["10.0.0.1:1234", None, None]
    assert {s.num_processes for s in specs} == {3}
    cpu = worker_specs(JaxConfig(), [(), ()], "127.0.0.1:9")
    assert [(s.platform, s.local_device_ids) for s in cpu] == [("cpu", None)] * 2


def test_import_phalanx_imports_no_jax_and_a_missing_jax_names_the_extra():
    code = (
        "import sys, phalanx\n"
        "assert 'jax' not in sys.modules, 'import phalanx imported jax'\n"
        "sys.modules['jax'] = None\n"
        "try:\n"
        "    import phalanx.jax\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'pip install "phalanx[jax]"' in out.stdout


def test_the_coordinator_port_is_held_until_jax_binds_it():
    """Between picking the port and jax's coordinator binding it, no other process can take it
    (gRPC shares it through SO_REUSEPORT; a plain bind is refused)."""
    import socket

    from phalanx.jax import _worker_setup as worker_setup

    port = worker_setup.reserve_port("127.0.0.1")
    try:
        other = socket.socket()
        with other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    finally:
        worker_setup._release()
    with socket.socket() as again:  # released: free again
        again.bind(("127.0.0.1", port))
