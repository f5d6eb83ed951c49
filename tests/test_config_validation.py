"""Every configuration field and trainer argument is checked at construction: the error names the
field, the value and what is allowed. Large pickled training functions are warned about."""

from __future__ import annotations

import logging
import math
import pathlib

import pytest

from phalanx import (
    BackendConfig,
    Checkpoint,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)


def trainer(**kwargs):
    return DataParallelTrainer(lambda: None, **kwargs)


S, F, C, D, R = ScalingConfig, FailureConfig, CheckpointConfig, DataConfig, RunConfig

# (constructor, field, bad value, words of what is allowed)
BAD = [
    (S, "num_workers", 1.5, "integer"),
    (S, "num_workers", True, "integer"),
    (S, "num_workers", (3, 2), "1 <= min_workers <= max_workers"),
    (S, "num_workers", (0, 2), "1 <= min_workers <= max_workers"),
    (S, "num_workers", (1, 2.0), "tuple of two integers"),
    (S, "num_workers", (1, 2, 3), "tuple of two integers"),
    (S, "use_gpu", 1, "True or False"),
    (S, "resources_per_worker", {"CPU": True}, "number >= 0"),
    (S, "resources_per_worker", {"CPU": math.nan}, "number >= 0"),
    (S, "resources_per_worker", [("CPU", 1)], "dict"),
    (S, "placement_strategy", "RANDOM", "PACK"),
    (S, "trainer_resources", {"CPU": -1}, "number >= 0"),
    (S, "trainer_resources", "CPU", "dict"),
    (S, "trainer_resources", {"CPU": True}, "number >= 0"),
    (S, "accelerator_type", "", "accelerator name"),
    (S, "accelerator_type", 100, "accelerator name"),
    (S, "engine", "docker", "local"),
    (S, "label_selector", 5, "dict of str to str"),
    (S, "use_tpu", 1, "True or False"),
    (S, "topology", "2x2", "None"),
    (S, "elastic_resize_monitor_interval_s", True, "seconds >= 0"),
    (S, "elastic_resize_monitor_interval_s", -1, "seconds >= 0"),
    (F, "max_failures", True, "integer >= -1"),
    (F, "max_failures", 1.0, "integer >= -1"),
    (F, "max_preemption_failures", "1", "integer >= -1"),
    (F, "hang_timeout_s", True, "number of seconds > 0"),
    (F, "hang_timeout_s", -1, "number of seconds > 0"),
    (F, "hang_timeout_s", "off", "number of seconds > 0"),
    (F, "hang_timeout_s", math.nan, "number of seconds > 0"),
    (F, "hang_timeout_s", math.inf, "finite"),
    (F, "hang_timeout_s", "10", "number of seconds > 0"),
    (F, "preemption_grace_s", False, "number of seconds >= 0"),
    (F, "preemption_grace_s", -1, "number of seconds >= 0"),
    (F, "controller_failure_limit", True, "integer >= -1"),
    (F, "relax_collectives_on_preemption", 1, "True or False"),
    (C, "num_to_keep", True, "integer >= 1"),
    (C, "checkpoint_score_attribute", "", "metric name"),
    (C, "checkpoint_score_attribute", 3, "metric name"),
    (C, "checkpoint_score_order", "best", "'max' or 'min'"),
    (C, "checkpoint_frequency", True, "integer >= 0"),
    (C, "checkpoint_at_end", "yes", "None, True or False"),
    (C, "checkpoint_at_end", 1, "None, True or False"),
    (D, "datasets_to_split", "train", "'all' or a list"),
    (D, "datasets_to_split", [1], "'all' or a list"),
    (D, "execution_options", 5, "an ExecutionOptions"),
    (D, "enable_shard_locality", 1, "True or False"),
    (D, "equal_split", "yes", "True or False"),
    (D, "equal_split", None, "True or False"),
    (D, "resume_position", "yes", "True, False or a dict"),
    (D, "resume_position", {"train": 1}, "True, False or a dict"),
    (R, "storage_path", "", "non-empty path"),
    (R, "storage_path", "   ", "non-empty path"),
    (R, "storage_path", 3, "path or a URI"),
    (R, "storage_path", "nosuchproto://bucket/x", "protocol fsspec knows"),
    (R, "storage_filesystem", "s3", "fsspec filesystem"),
    (R, "worker_runtime_env", 5, "None or a dict"),
    (R, "logging_config", "DEBUG", "None or a LoggingConfig"),
    (R, "sync_config", {"sync_period": 1}, "None or a SyncConfig"),
    (R, "failure_config", {"max_failures": 1}, "FailureConfig"),
    (R, "checkpoint_config", {"num_to_keep": 1}, "CheckpointConfig"),
    (R, "callbacks", object(), "list of phalanx.Callback"),
    (R, "callbacks", [object()], "list of phalanx.Callback"),
    (R, "verbose", True, "integer from 0 to 3"),
    (R, "verbose", 5, "integer from 0 to 3"),
    (R, "verbose", "1", "integer from 0 to 3"),
]


@pytest.mark.parametrize(("build", "field", "value", "allowed"), BAD)
def test_every_config_field_is_checked_at_construction(build, field, value, allowed):
    with pytest.raises(ConfigError) as info:
        build(**{field: value})
    message = str(info.value)
    assert f"{build.__name__}({field}={value!r})" in message
    assert allowed in message


def test_every_field_of_every_config_is_in_the_table():
    import dataclasses

    covered = {(build, field) for build, field, _, _ in BAD}
    for build in (S, F, C, D, R):
        for f in dataclasses.fields(build):
            if (build, f.name) == (R, "name"):  # RunConfig.name: tested with the run lock/names
                continue
            assert (build, f.name) in covered, f"{build.__name__}.{f.name} has no bad value"


BAD_ARGS = [
    ({"train_loop_config": [1]}, "train_loop_config=[1]", "dict"),
    ({"backend_config": object()}, "backend_config=", "phalanx.BackendConfig"),
    ({"scaling_config": {"num_workers": 2}}, "scaling_config=", "phalanx.ScalingConfig"),
    ({"run_config": {"name": "x"}}, "run_config=", "phalanx.RunConfig"),
    ({"datasets": [1, 2]}, "datasets=[1, 2]", "dict"),
    ({"dataset_config": {"equal_split": True}}, "dataset_config=", "phalanx.DataConfig"),
    ({"resume_from_checkpoint": "/tmp/ckpt"}, "resume_from_checkpoint=", "phalanx.Checkpoint"),
    ({"metadata": [("a", 1)]}, "metadata=[('a', 1)]", "dict"),
    ({"metadata": {"a": object()}}, "metadata=", "JSON"),
    ({"metadata": {1: "a"}}, "key 1 is not a string", "str keys"),
]


@pytest.mark.parametrize(("kwargs", "shown", "allowed"), BAD_ARGS)
def test_every_trainer_argument_is_checked_at_construction(kwargs, shown, allowed):
    with pytest.raises(ConfigError) as info:
        trainer(**kwargs)
    assert shown in str(info.value) and allowed in str(info.value)


def test_train_loop_per_worker_must_be_a_function():
    with pytest.raises(ConfigError, match="train_loop_per_worker=3 is invalid"):
        DataParallelTrainer(3)


def test_good_values_are_accepted(tmp_path):
    import fsspec

    ScalingConfig(trainer_resources={"CPU": 0}, accelerator_type="A100")
    ScalingConfig(resources_per_worker={"CPU": 0.5, "memory": 10**9})
    FailureConfig(hang_timeout_s=0.5, preemption_grace_s=0, max_failures=-1)
    for off_or_auto in (None, 0, "auto"):
        FailureConfig(hang_timeout_s=off_or_auto)
    CheckpointConfig(checkpoint_at_end=False, num_to_keep=None)
    DataConfig(datasets_to_split=["train"], equal_split=False)
    for path in (pathlib.Path(tmp_path), "s3://bucket/x", "memory://x", "file:///tmp/x"):
        RunConfig(storage_path=path)
    RunConfig(storage_filesystem=fsspec.filesystem("memory"), verbose=0, callbacks=())
    # a filesystem of the user's own, with its own protocol
    RunConfig(storage_path="mine://bucket/x", storage_filesystem=fsspec.filesystem("memory"))
    trainer(
        train_loop_config={"a": 1},
        metadata={"a": [1, 2.5, None]},
        datasets=None,
        backend_config=BackendConfig(),
        resume_from_checkpoint=Checkpoint(str(tmp_path)),
    )


def test_an_empty_storage_path_no_longer_means_the_default():
    # Before: storage_path="" silently became ~/phalanx_results.
    with pytest.raises(ConfigError, match="HINT: leave storage_path unset"):
        RunConfig(storage_path="")


def test_a_large_pickled_training_function_is_warned_about_with_its_size(caplog):
    blob = b"x" * 60_000_000

    def uses_blob():
        return len(blob)

    with caplog.at_level(logging.WARNING, logger="phalanx.trainer"):
        trainer_with_blob = DataParallelTrainer(uses_blob)
    warned = [r.getMessage() for r in caplog.records if "pickles to" in r.getMessage()]
    assert len(warned) == 1
    assert "pickles to 60 MB" in warned[0] and "HINT" in warned[0] and "datasets=" in warned[0]
    assert len(trainer_with_blob._payload) > 60_000_000

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="phalanx.trainer"):
        DataParallelTrainer(lambda: None)
    assert not [r for r in caplog.records if "pickles to" in r.getMessage()]
