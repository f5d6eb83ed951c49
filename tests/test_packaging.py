"""Packaging: a light core, optional parts behind extras with a clear error when one is missing,
one version, and a wheel that carries py.typed and the LICENSE.

A missing package is simulated in a fresh interpreter by a ``sys.meta_path`` finder that refuses
it, exactly as Python reports a package that is not installed; nothing is uninstalled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import phalanx
from phalanx._foundation.optional import EXTRAS, MissingDependencyError, missing, require

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = """
import sys

class _NotInstalled:
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled(set(sys.argv[1].split(","))))
"""


def run_without(blocked: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which the packages ``blocked`` (comma separated)
    cannot be imported."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, blocked, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(__import__('json').dumps(sorted(sys.modules)))"
    out = run_without("", code)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def imported_after(statement: str) -> set[str]:
    return {m.split(".")[0] for m in modules_after(statement)}


# -- a light core ---------------------------------------------------------------------------------


def test_import_phalanx_imports_no_data_stack_and_no_framework():
    heavy = {"numpy", "pandas", "pyarrow", "torch", "ray", "rich", "xgboost", "lightgbm"}
    assert imported_after("import phalanx") & heavy == set()


def test_import_phalanx_torch_imports_no_pandas_or_pyarrow():
    """Training with torch needs neither; TorchPredictor (which does) is imported on first use."""
    assert imported_after("import phalanx.torch") & {"pandas", "pyarrow"} == set()
    out = run_without("", "from phalanx.torch import TorchPredictor; print(TorchPredictor)")
    assert out.returncode == 0 and "TorchPredictor" in out.stdout, out.stderr


def test_import_phalanx_torch_leaves_distributed_checkpoint_to_save_state():
    """torch.distributed.checkpoint and DTensor pull in sympy: 0.6 s here, 3.5 s per GPU worker
    measured on an H200 host (bench/results/gpu_2026-11-27), paid before the first line of
    every TorchTrainer worker while phalanx.torch imported them. save_state imports them."""
    loaded = modules_after("import phalanx.torch")
    heavy = {"sympy", "torch.distributed.checkpoint", "torch.distributed.tensor"}
    assert loaded & heavy == set()
    used = modules_after(
        "import torch\nfrom phalanx.torch._state import _dcp, _state_dict_api\n"
        "_dcp(); _state_dict_api()"
    )
    assert {"torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict"} <= used


def test_import_phalanx_torch_leaves_the_run_machinery_to_fit():
    """What only fit() needs (the controller, the engines, fsspec) is imported by fit(): the
    import a user's script pays before its first line stays ~25 ms over torch's own."""
    loaded = modules_after("import phalanx.torch")
    run_only = ("phalanx._internal.controller", "phalanx._internal.engines", "fsspec")
    assert {m for m in loaded if m.startswith(run_only)} == set()
    # ...and fit() still finds them: the checkpoint path brings fsspec when it is needed.
    code = "import sys, phalanx; phalanx.Checkpoint('.'); print('fsspec' in sys.modules)"
    out = run_without("", code)
    assert out.returncode == 0 and out.stdout.split()[-1] == "True", out.stderr


@pytest.mark.slow
def test_a_run_needs_no_optional_package(tmp_path):
    """fit(), the Result and its checkpoint work with every optional package missing."""
    code = f"""
import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

def loop(config):
    import os, tempfile
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "w"), "w").write("1")
        train.report({{"loss": 1.0}}, checkpoint=Checkpoint.from_directory(d))

result = DataParallelTrainer(
    loop, scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(storage_path={str(tmp_path)!r}, name="core"),
).fit()
assert result.error is None and result.metrics["loss"] == 1.0, result
assert result.checkpoint is not None
try:
    result.metrics_dataframe
except ModuleNotFoundError as exc:
    print("ERROR", exc)
"""
    out = run_without("numpy,pandas,pyarrow,torch,ray,rich,matplotlib", code)
    assert out.returncode == 0, out.stderr
    assert "Result.metrics_dataframe needs the 'pandas' package" in out.stdout
    assert 'HINT: pip install "phalanx[data]"' in out.stdout


# -- a missing extra is named ---------------------------------------------------------------------

CASES = [
    ("xgboost", "import phalanx.xgboost", "phalanx.xgboost", "xgboost"),
    ("lightgbm", "import phalanx.lightgbm", "phalanx.lightgbm", "lightgbm"),
    ("sklearn", "import phalanx.sklearn", "phalanx.sklearn", "sklearn"),
    ("pandas", "import phalanx.xgboost", "phalanx.xgboost", "xgboost"),
    ("torch", "import phalanx.torch", "phalanx.torch", "torch"),
    ("numpy", "import phalanx.torch", "phalanx.torch", "torch"),
    ("torch", "import phalanx.lightning", "phalanx.lightning", "lightning"),
    ("transformers", "import phalanx.huggingface.transformers", "", "transformers"),
    ("jax", "import phalanx.jax", "phalanx.jax", "jax"),
    ("tensorflow", "import phalanx.tensorflow", "phalanx.tensorflow", "tensorflow"),
    ("pyarrow", "import phalanx.data", "phalanx.data", "data"),
    ("pandas", "import phalanx.preprocess", "phalanx.preprocess", "data"),
    ("pandas", "from phalanx.predict import BatchPredictor", "phalanx.predict", "data"),
    ("mlflow", "from phalanx.integrations import MLflowLoggerCallback as C; C()", "", "mlflow"),
    ("wandb", "from phalanx.integrations import WandbLoggerCallback as C; C()", "", "wandb"),
    (
        "tensorboardX",
        "from phalanx.integrations import TBXLoggerCallback as C; C()",
        "",
        "tensorboard",
    ),
    (
        "uvicorn",
        "from phalanx.serve._server import uvicorn_server as u; u(None, None)",
        "",
        "serve",
    ),
    ("starlette", "from phalanx.serve._app import build_app; build_app(None)", "", "serve"),
]


@pytest.mark.parametrize(("blocked", "statement", "feature", "extra"), CASES)
def test_a_missing_package_names_the_extra_that_installs_it(blocked, statement, feature, extra):
    code = f"""
try:
    {statement}
except ModuleNotFoundError as exc:
    print(type(exc).__name__, exc.name)
    print(exc)
else:
    print("imported")
"""
    out = run_without(blocked, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"MissingDependencyError {blocked}\n"), out.stdout
    assert f'HINT: pip install "phalanx[{extra}]"' in out.stdout
    assert f"{feature} needs the " in out.stdout


def test_a_missing_package_in_lightning_itself_names_the_extra():
    out = run_without("lightning,pytorch_lightning", "import phalanx.lightning")
    assert out.returncode == 1
    assert 'HINT: pip install "phalanx[lightning]"' in out.stderr


def test_the_ray_engine_without_ray_names_the_extra():
    code = """
from phalanx import DataParallelTrainer, ScalingConfig
try:
    DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(engine="ray")).fit()
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    out = run_without("ray", code)
    assert out.stdout.startswith("ConfigError"), out.stdout + out.stderr
    assert 'pip install "phalanx[ray]"' in out.stdout


def test_the_metrics_command_without_pandas_is_a_clear_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")  # a run that reported nothing yet
    code = "import sys\nfrom phalanx.cli import main\nsys.exit(main(['metrics', sys.argv[2]]))"
    out = run_without("pandas", code, str(run))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert 'pip install "phalanx[data]"' in out.stderr


def test_require_passes_other_import_errors_through():
    """A package missing from inside an unrelated module is not blamed on an extra."""
    with pytest.raises(ModuleNotFoundError) as info:
        require("phalanx_no_such_module", "a test")
    assert not isinstance(info.value, MissingDependencyError)
    assert missing("a test", "json", "os") is None


def test_every_extra_named_in_an_error_exists():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for module, (extra, _package) in EXTRAS.items():
        assert extra in extras, f"{module}: the error names phalanx[{extra}], which is no extra"
    everything = " ".join(extras["all"] + extras["frameworks"])
    for extra in ("torch", "xgboost", "lightgbm", "ray", "s3", "gcs", "azure", "trackers"):
        assert extra in everything, extra
    # The core: what every run needs, nothing of the data stack or a framework.
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == ["cloudpickle", "fsspec"]


# -- one version, a typed package, a licensed wheel -------------------------------------------------


def test_the_version_has_one_source():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "phalanx._version.__version__"
    from phalanx._version import __version__

    assert phalanx.__version__ == __version__


@pytest.mark.slow
def test_the_wheel_carries_py_typed_license_and_metadata(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("phalanx-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(metadata).decode()
    assert "phalanx/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert f"Version: {phalanx.__version__}\n" in meta
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Python: >=3.10" in meta
    core = [
        line for line in meta.splitlines() if line.startswith("Requires-Dist:") and ";" not in line
    ]
    assert sorted(core) == ["Requires-Dist: cloudpickle>=2.2", "Requires-Dist: fsspec>=2023.1"]
    assert "Provides-Extra: xgboost" in meta and "Provides-Extra: all" in meta
