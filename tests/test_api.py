"""The public surface: exact exports, a light import, clear errors for misuse and bad config."""

from __future__ import annotations
import __future__

import importlib
import pkgutil
import subprocess
import sys
import threading
import types

import pytest

import phalanx
from phalanx import (
    CheckpointConfig,
    ConfigError,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    SessionMisuseError,
)

# Public modules of phalanx's public packages, and why each is public; every other module in a
# public package has a leading underscore, so refactoring it breaks no import a user can see.
PUBLIC_MODULES = {
    # The root's definition modules: the root re-exports their names (phalanx.ScalingConfig, ...).
    # Several mirror a Ray module path users import from.
    "phalanx.backend": "ray.train.backend (Backend, BackendConfig)",
    "phalanx.callbacks": "the root's callback definitions",
    "phalanx.checkpoint": "the root's Checkpoint",
    "phalanx.collective": "ray.train.collective",
    "phalanx.config": "ray.air.config",
    "phalanx.constants": "ray.train.constants",
    "phalanx.context": "ray.train.context",
    "phalanx.errors": "the root's errors",
    "phalanx.reported_checkpoint": "the root's ReportedCheckpoint",
    "phalanx.result": "ray.air.result",
    "phalanx.session": "ray.air.session",
    "phalanx.trainer": "ray.train.trainer",
    "phalanx.validation": "the root's validation config",
    # Packages.
    "phalanx.cli": "the phalanx command",
    "phalanx.data": "ray.data (Dataset, read_*, from_*)",
    "phalanx.horovod": "ray.train.horovod",
    "phalanx.huggingface": "ray.train.huggingface",
    "phalanx.huggingface.transformers": "ray.train.huggingface.transformers",
    "phalanx.integrations": "ray.air.integrations",
    "phalanx.jax": "ray.train.v2.jax",
    "phalanx.lightgbm": "ray.train.lightgbm",
    "phalanx.lightning": "ray.train.lightning",
    "phalanx.migrate": "phalanx migrate: the codemod that ports Ray Train code (migrate_source)",
    "phalanx.predict": "ray.train.predictor, ray.train.batch_predictor (AIR)",
    "phalanx.preprocess": "ray.data.preprocessors",
    "phalanx.tensorflow": "ray.train.tensorflow",
    "phalanx.torch": "ray.train.torch",
    "phalanx.serve": "phalanx serve / Ray Serve deployments of predictors",
    "phalanx.ui": "phalanx ui: the run viewer (start() serves it from a notebook)",
    "phalanx.tune": "ray.tune (Tuner, TuneConfig, search spaces, report, get_context)",
    "phalanx.tune.integration": "ray.tune.integration",
    "phalanx.tune.integration.ray_train": "ray.tune.integration.ray_train (TuneReportCallback)",
    "phalanx.tune.schedulers": "ray.tune.schedulers",
    "phalanx.tune.search": "ray.tune.search",
    "phalanx.tune.search.optuna": "ray.tune.search.optuna (OptunaSearch)",
    "phalanx.sklearn": "ray.train.sklearn (AIR's SklearnTrainer)",
    "phalanx.xgboost": "ray.train.xgboost",
    # Modules inside packages that mirror a Ray module path.
    "phalanx.integrations.logger": "ray.tune.logger",
    "phalanx.integrations.mlflow": "ray.air.integrations.mlflow",
    "phalanx.integrations.wandb": "ray.air.integrations.wandb",
    "phalanx.tensorflow.keras": "ray.train.tensorflow.keras",
}


def _public_packages(name: str = "phalanx") -> list[str]:
    found = [name]
    for info in pkgutil.iter_modules(importlib.import_module(name).__path__):
        if info.ispkg and not info.name.startswith("_"):
            found += _public_packages(f"{name}.{info.name}")
    return found


@pytest.mark.parametrize("package", _public_packages())
def test_all_is_exact(package):
    """Every public package shows its API alone: each public name is in ``__all__`` (or is one
    of its public modules), each ``__all__`` name exists, and no module is public by accident."""
    module = importlib.import_module(package)
    assert package == "phalanx" or package in PUBLIC_MODULES, (
        f"{package} is new: add it to PUBLIC_MODULES with a reason"
    )
    submodules = {
        info.name for info in pkgutil.iter_modules(module.__path__) if not info.name.startswith("_")
    }
    unlisted = {f"{package}.{name}" for name in submodules} - set(PUBLIC_MODULES)
    assert not unlisted, f"implementation modules without a leading underscore: {unlisted}"
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, __future__._Feature)  # from __future__ import annotations
        and not (name in submodules and isinstance(value, types.ModuleType))
    }
    unexported = public - set(module.__all__)
    assert not unexported, f"public names of {package} missing from its __all__"
    # Names made on first use (a module __getattr__) are resolved in a fresh process: resolving
    # them imports their framework (TensorFlow sets environment variables when imported).
    lazy = [name for name in module.__all__ if name not in vars(module)]
    if lazy:
        code = f"import {package} as m; print([n for n in {lazy!r} if not hasattr(m, n)])"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.stdout.strip() == "[]", f"{package}.__all__ names missing: {run.stdout}"


def test_import_is_light():
    code = (
        "import sys, phalanx\n"
        "heavy = [m for m in ('torch', 'ray', 'xgboost', 'lightgbm', 'pandas') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "api",
    [
        lambda: phalanx.report({"a": 1}),
        phalanx.get_context,
        phalanx.get_checkpoint,
        lambda: phalanx.get_dataset_shard("x"),
    ],
)
def test_worker_api_outside_a_worker_is_a_clear_error(api):
    with pytest.raises(SessionMisuseError, match="inside a training function"):
        api()


def test_worker_api_in_a_plain_thread_is_a_clear_error():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_catch(phalanx.get_context)))
    thread.start()
    thread.join()
    assert isinstance(errors[0], SessionMisuseError)


def _catch(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    return None


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ScalingConfig(num_workers=-1), "num_workers=-1"),
        (lambda: ScalingConfig(num_workers=-2), "num_workers=-2"),
        (lambda: ScalingConfig(num_workers=1.5), "num_workers=1.5"),
        (lambda: ScalingConfig(placement_strategy="RANDOM"), "placement_strategy='RANDOM'"),
        (lambda: ScalingConfig(resources_per_worker={"GPU": 1}), "resources_per_worker"),
        (lambda: ScalingConfig(resources_per_worker={"CPU": -1}), "resources_per_worker"),
        (lambda: CheckpointConfig(checkpoint_score_order="best"), "checkpoint_score_order='best'"),
        (lambda: CheckpointConfig(num_to_keep=0), "num_to_keep=0"),
        (lambda: FailureConfig(max_failures=-5), "max_failures=-5"),
        (lambda: RunConfig(name="a/b"), "name='a/b'"),
        (lambda: RunConfig(callbacks=[object()]), "callbacks"),
    ],
)
def test_bad_config_names_field_and_value(build, field):
    with pytest.raises(ConfigError) as info:
        build()
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_config_error_lists_allowed_values():
    with pytest.raises(ConfigError, match="'max' or 'min'"):
        CheckpointConfig(checkpoint_score_order="best")


def test_non_picklable_train_fn_fails_at_construction_with_hint():
    lock = threading.Lock()

    def train_fn():
        with lock:
            pass

    with pytest.raises(ConfigError, match="cannot be pickled") as info:
        DataParallelTrainer(train_fn)
    assert "HINT" in str(info.value)


def test_train_fn_with_two_required_args_is_rejected():
    with pytest.raises(ConfigError, match="none or one"):
        DataParallelTrainer(lambda a, b: None)


def test_ray_config_objects_are_rejected_with_a_hint():
    with pytest.raises(ConfigError, match=r"phalanx\.ScalingConfig"):
        DataParallelTrainer(lambda: None, scaling_config={"num_workers": 2})


def test_default_resources_follow_ray():
    assert ScalingConfig()._resources_per_worker_not_none == {"CPU": 1}
    assert ScalingConfig(use_gpu=True).num_gpus_per_worker == 1
    assert ScalingConfig(num_workers=3, resources_per_worker={"CPU": 2}).total_resources == {
        "CPU": 6
    }
