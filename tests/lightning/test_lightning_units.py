"""phalanx.lightning without worker processes: imports, flavour choice, clear errors."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

import pytest

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.plugins.environments import LightningEnvironment  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

from phalanx import DataParallelTrainer, RunConfig, ScalingConfig  # noqa: E402
from phalanx.lightning import (  # noqa: E402
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayLightningEnvironment,
    prepare_trainer,
)
from phalanx.lightning._flavour import _preference  # noqa: E402


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_phalanx_and_phalanx_torch_do_not_import_lightning():
    out = _run(
        "import sys, phalanx, phalanx.torch\n"
        "print([m for m in ('lightning', 'pytorch_lightning') if m in sys.modules])"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_lightning_names_the_extra():
    out = _run(
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['lightning.pytorch'] = None\n"
        "sys.modules['pytorch_lightning'] = None\n"
        "import phalanx.lightning"
    )
    assert out.returncode != 0
    assert "ModuleNotFoundError" in out.stderr
    assert 'pip install "phalanx[lightning]"' in out.stderr


def test_binds_to_the_lightning_package_the_script_imported():
    assert _preference({"pytorch_lightning"})[0] == "pytorch_lightning"
    assert _preference({"pytorch_lightning", "lightning.pytorch"})[0] == "lightning.pytorch"
    assert _preference(set())[0] == "lightning.pytorch"  # Ray's order
    # A run with `import pytorch_lightning as pl`: test_lightning_guide.py.


def _in_worker(fn, storage):
    """``fn()`` inside a training function (a thread-engine worker: ranks, no processes)."""

    def loop():
        return fn()

    trainer = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(storage_path=str(storage)),
    )
    return trainer.fit().return_value


def _trainer(**kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tempfile.gettempdir(),
        **kwargs,
    )


def _errors_of(*make_trainers):
    errors = []
    for make in make_trainers:
        try:
            trainer = make()
            assert prepare_trainer(trainer) is trainer
            errors.append(None)
        except RuntimeError as exc:
            errors.append(str(exc))
    return errors


def test_prepare_trainer_accepts_ray_ones_and_rejects_lightnings_own(tmp_path):
    ok, strategy, environment = _in_worker(
        lambda: _errors_of(
            lambda: _trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()]),
            lambda: _trainer(strategy=DDPStrategy()),
            lambda: _trainer(strategy=RayDDPStrategy(), plugins=[LightningEnvironment()]),
        ),
        tmp_path,
    )
    assert ok is None
    assert re.search(r"(?s)Invalid strategy class: DDPStrategy.*HINT", strategy)
    assert re.search(r"(?s)LightningEnvironment.*HINT: pass plugins=", environment)


def test_ray_environment_gives_the_runs_ranks_whatever_devices_says(tmp_path):
    def ranks():
        env = RayLightningEnvironment()
        env.set_world_size(7)  # what Lightning does with num_nodes * devices: ignored
        env.set_global_rank(5)
        return env.world_size(), env.global_rank(), env.creates_processes_externally

    assert _in_worker(ranks, tmp_path) == (1, 0, True)


def test_deepspeed_strategy_names_the_extra_when_deepspeed_is_missing():
    try:
        import deepspeed  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ModuleNotFoundError, match=r'pip install "phalanx\[deepspeed\]"'):
            RayDeepSpeedStrategy()
    else:
        pytest.skip("DeepSpeed is installed here")
