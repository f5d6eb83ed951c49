"""What report() accepts as metrics, unit by unit. Metric keys are checked at every depth, not only at the top: a nested dict with a non-string
key would be stored as JSON with the key turned into a string, so ``Result.from_path`` would give
back ``{"3": ...}`` where ``fit()`` returned ``{3: ...}``. Nesting is bounded (64 levels)."""

from __future__ import annotations

import datetime
from collections import OrderedDict

import numpy as np
import pytest

import phalanx as train
from phalanx import DataParallelTrainer, RunConfig, ScalingConfig, TrainingFailedError
from phalanx._internal.worker.metrics import checked_metrics


def nested_lists(levels: int) -> list:
    value: list = [1.0]
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("inner", [3, 2.5, (1, 2), None, True])
def test_a_nested_non_string_key_is_refused_naming_the_path(inner):
    with pytest.raises(ValueError) as info:
        checked_metrics({"per_class": {"ok": {inner: 0.5}}})
    message = str(info.value)
    assert f"Metric 'per_class/ok' holds the key {inner!r}" in message
    assert "HINT: use string keys" in message


def test_string_keys_at_every_depth_are_kept_as_they_are():
    metrics = {"per_class": {"cat": {"precision": 0.5, "recall": [0.25, {"top1": 1.0}]}}}
    assert checked_metrics(metrics) is metrics


def test_nesting_is_accepted_to_64_levels_and_refused_beyond():
    assert checked_metrics({"deep": nested_lists(64)}) == {"deep": nested_lists(64)}
    with pytest.raises(ValueError, match=r"Metric 'deep' is nested more than 64 levels deep"):
        checked_metrics({"deep": nested_lists(65)})
    deep_dict: dict = {"leaf": 1}
    for _ in range(63):
        deep_dict = {"k": deep_dict}
    assert checked_metrics({"deep": deep_dict}) == {"deep": deep_dict}  # 64 dicts
    with pytest.raises(ValueError, match=r"nested more than 64 levels deep"):
        checked_metrics({"deep": {"k": deep_dict}})


def test_report_with_a_nested_int_key_fails_the_run_on_the_worker(tmp_path):
    def loop():
        train.report({"per_class": {3: 0.5}})

    trainer = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="m", storage_path=str(tmp_path)),
    )
    with pytest.raises(TrainingFailedError) as info:
        trainer.fit()
    failure = info.value.worker_failures[0]
    assert failure.type_name == "ValueError"
    assert "Metric 'per_class' holds the key 3 (int)" in failure.message


# -- what each refusal says, and what the checks give back (mutation survivors, bench/mutation.py)


def test_a_tuple_key_gets_a_slash_joined_hint_and_another_key_its_str():
    with pytest.raises(ValueError, match=r"HINT: use a string key, e\.g\. '1/2'\.$"):
        checked_metrics({(1, 2): 0.5})
    with pytest.raises(ValueError, match=r"Metric key 3 is a int(.|\n)*e\.g\. '3'\.$"):
        checked_metrics({3: 0.5})


def test_a_reserved_key_lists_every_reserved_key():
    with pytest.raises(ValueError) as info:
        checked_metrics({"timestamp": 1})
    reserved = "_phalanx_attempt, checkpoint_dir_name, timestamp, training_iteration"
    assert f"(reserved: {reserved})" in str(info.value)


def test_a_value_json_cannot_hold_is_shown_short_with_the_default_hint():
    with pytest.raises(ValueError) as info:
        checked_metrics({"x": {1, 2}})
    assert "Metric 'x' = {1, 2} is a builtins.set" in str(info.value)
    long_value = frozenset(range(100))
    with pytest.raises(ValueError) as info:
        checked_metrics({"x": long_value})
    assert f"= {repr(long_value)[:77]}... is a builtins.frozenset" in str(info.value)
    with pytest.raises(ValueError) as info:
        checked_metrics({"x": object()})
    assert str(info.value).endswith("HINT: convert it to a number, string, list or dict of those.")


def test_a_bad_value_inside_a_numpy_array_names_the_metric():
    with pytest.raises(ValueError, match=r"Metric 'when' = datetime\.date"):
        checked_metrics({"when": np.array([datetime.date(2024, 1, 2)], dtype=object)})


def test_torch_tensors_and_parameters_get_rays_message_and_hint():
    torch = pytest.importorskip("torch")
    for value in (torch.tensor(0.5), torch.nn.Parameter(torch.tensor(0.5))):
        with pytest.raises(ValueError) as info:
            checked_metrics({"loss": value})
        message = str(info.value)
        assert "Torch tensors as metrics is not supported" in message, type(value)
        assert message.endswith(
            "HINT: convert the tensors to Python objects (ex: `.item()`, `.tolist()`) or save "
            "tensors as part of the checkpoint files instead."
        )


def test_dict_subclasses_and_nested_numpy_values_become_plain_python():
    assert type(checked_metrics(OrderedDict(a=1))) is dict
    assert checked_metrics(OrderedDict(a=1)) == {"a": 1}
    converted = checked_metrics({"d": OrderedDict(a=1), "n": {"b": np.float32(0.5)}})
    assert type(converted["d"]) is dict and converted["d"] == {"a": 1}
    assert type(converted["n"]["b"]) is float and converted["n"] == {"b": 0.5}
    plain = {"d": {"a": 1.0}, "l": [1, {"b": 2}]}
    assert checked_metrics(plain) is plain  # nothing to convert: no copy


class Meters(float):
    pass


def test_lists_and_number_subclasses_become_plain_python():
    converted = checked_metrics({"l": [np.int64(1), 2], "m": Meters(2.5), "t": (1,)})
    assert type(converted["l"][0]) is int and converted["l"] == [1, 2]
    assert type(converted["m"]) is float and converted["m"] == 2.5
    assert converted["t"] == [1]


def test_refusals_say_what_happened_in_full():
    with pytest.raises(TypeError, match=r"^report\(\) takes a dict of metrics, got list\.$"):
        checked_metrics([1])
    with pytest.raises(ValueError) as info:
        checked_metrics({"k": {3: 1}})
    assert str(info.value).endswith(
        "keys of nested metric dicts must be strings too.\nHINT: use string keys."
    )
    with pytest.raises(ValueError) as info:
        checked_metrics({"x": {1}})
    assert (
        "which the metrics history (JSON) cannot hold exactly, so Result.from_path would give "
        "back something else.\nHINT: " in str(info.value)
    )


@pytest.mark.parametrize(
    ("size", "shown"), [(77, "b'" + "x" * 77 + "'"), (78, "b'" + "x" * 75 + "...")]
)
def test_a_refused_value_is_shown_whole_up_to_80_characters(size, shown):
    with pytest.raises(ValueError) as info:
        checked_metrics({"x": b"x" * size})
    assert f"Metric 'x' = {shown} is a builtins.bytes" in str(info.value)
