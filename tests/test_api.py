"""The public surface: exact exports, a light import, clear errors for misuse and bad config."""

from __future__ import annotations

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


def test_all_is_exact():
    public = {
        name
        for name, value in vars(phalanx).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(phalanx.__all__) - {"__version__"}
    for name in phalanx.__all__:
        assert hasattr(phalanx, name), name


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
