"""The rule table cannot rot: every phalanx name it targets exists, and every public name of a
Ray module it maps whole (``__all__`` of the installed Ray 2.60) exists in the phalanx target.

The imports run in a child process: importing phalanx.torch, phalanx.tensorflow, ... sets
environment variables (KMP_*, TF_*) that the leak check would blame on the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from phalanx.migrate._resolve import exports, resolve
from phalanx.migrate._rules import MODULES, NAMES, rule_count

_CHECK = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    warnings.simplefilter("ignore")
    from phalanx.migrate._rules import MODULES, NAMES, PARTIAL

    def exists(target):
        dotted, _, call = target.partition("()")
        module, _, name = dotted.rpartition(".")
        try:
            obj = importlib.import_module(dotted)
        except ImportError:
            obj = getattr(importlib.import_module(module), name, None)
        if obj is None:
            return False
        if call:  # phalanx.session.get_context().get_world_rank: a TrainContext method
            from phalanx import TrainContext
            return hasattr(TrainContext, call.lstrip("."))
        return True

    targets = sorted({*MODULES.values(), *PARTIAL.values(), *NAMES.values()})
    missing = [t for t in targets if not exists(t)]
    whole = {}
    for ray_module, target in MODULES.items():
        try:
            names = importlib.import_module(ray_module).__all__
        except (ImportError, AttributeError):  # not in Ray 2.60, or no __all__ to compare
            continue
        phalanx_module = importlib.import_module(target)
        whole[ray_module] = [n for n in names if not hasattr(phalanx_module, n)]
    json.dump({"missing": missing, "whole": whole}, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def checked() -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the child imports every framework (~40 s on 2 cores)
def test_every_target_exists_in_phalanx(checked: dict) -> None:
    assert checked["missing"] == []


@pytest.mark.slow
def test_every_name_of_a_whole_ray_module_exists_in_its_target(checked: dict) -> None:
    # The rows Ray 2.60 still ships with an __all__: ray.train, .torch, .xgboost, .lightgbm,
    # .lightning, .tensorflow, .huggingface.transformers, .collective, .v2.jax, ...
    whole = dict(checked["whole"])
    # Rows phalanx covers in part: phalanx.preprocess has the common preprocessors,
    # phalanx.integrations.logger Tune's three logger callbacks, and phalanx.tune the Tuner, its
    # spaces, Optuna's search and four schedulers. The rest is listed for the user.
    partial = ["ray.data.preprocessors", "ray.tune.logger"]
    partial += [m for m in whole if m == "ray.tune" or m.startswith("ray.tune.")]
    for module in dict.fromkeys(partial):
        for name in whole.pop(module):
            res = resolve([*module.split("."), name])
            assert res.kind == "UNSUPPORTED" and name in res.advice
    assert len(whole) >= 9
    assert {module: names for module, names in whole.items() if names} == {}


@pytest.mark.parametrize(
    "ray_name",
    [
        "ray.train.huggingface.TransformersTrainer",
        "ray.train.huggingface.AccelerateTrainer",
        "ray.train.lightning.LightningTrainer",
        "ray.train.lightning.LightningConfigBuilder",
        "ray.train.sklearn.SklearnTrainer",
        "ray.train.sklearn.SklearnCheckpoint",
        "ray.train.sklearn.SklearnPredictor",
    ],
)
def test_air_trainers_map_to_phalanx(ray_name: str) -> None:
    module, _, name = ray_name.rpartition(".")
    target = MODULES[module]
    assert name in (exports(target) or ()), f"{target} does not export {name}"
    res = resolve(ray_name.split("."))
    assert (res.kind, res.target) == ("MAPPED", f"{target}.{name}")


def test_the_table_reads_phalanx_statically() -> None:
    # exports() reads __all__ from the source: no framework is imported to check a name.
    assert "TorchTrainer" in (exports("phalanx.torch") or ())
    assert "get_context" in (exports("phalanx.session") or ())
    assert exports("phalanx.no_such_module") is None
    assert rule_count() == len(MODULES) + len(NAMES)
