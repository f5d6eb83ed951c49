"""A model that cannot be loaded is a startup failure: `phalanx serve` says why and what option
to add, and exits, and `phalanx.serve.serve()` raises; a server that starts says "Serving on" only
once its model is loaded, names the checkpoint once, and says when it stops."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch
from serve_models import make_net

import phalanx.serve
from phalanx.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))


def serve_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]))
    command = [sys.executable, "-m", "phalanx", "serve", *args, "--port", "0"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def weights_only_state(tmp_path):
    """A checkpoint like the README demo's before it saved model.pt: only its own state.pt."""
    path = tmp_path / "checkpoint_000004"
    path.mkdir()
    torch.save({"model": make_net().state_dict(), "epoch": 4}, path / "state.pt")
    return str(path)


@pytest.fixture
def state_dict_checkpoint(tmp_path):
    """model.pt holding a state dict: it needs the module to load it into."""
    path = tmp_path / "state_dict"
    path.mkdir()
    torch.save(make_net().state_dict(), path / "model.pt")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_cli_exits_with_the_reason_when_the_model_cannot_load(
    weights_only_state, state_dict_checkpoint, workers
):
    started = time.monotonic()
    done = serve_cli(weights_only_state, "--predictor", "torch", "--workers", workers)
    assert done.returncode == 2, done.stderr
    assert "holds state.pt, not model.pt" in done.stderr
    assert "--model my_module:make_model" in done.stderr
    assert "--predictor my_module:MyPredictor" in done.stderr
    assert "Serving on" not in done.stdout + done.stderr
    assert "model=" not in done.stderr and "predictor=" not in done.stderr  # no Python keywords

    done = serve_cli(state_dict_checkpoint, "--workers", workers)
    assert done.returncode == 2, done.stderr
    assert "holds a state dict" in done.stderr
    assert "HINT: name the module to load them into: --model my_module:make_model" in done.stderr
    assert "Serving on" not in done.stdout + done.stderr
    assert time.monotonic() - started < 50  # not a server left waiting for a model


def test_the_cli_hint_for_an_unknown_framework_names_the_option(tmp_path):
    done = serve_cli(str(tmp_path))
    assert done.returncode == 2
    assert "HINT: pass --predictor torch, xgboost, lightgbm" in done.stderr
    assert "or my_module:MyPredictor." in done.stderr and "predictor=" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_raises_when_the_model_cannot_load(
    weights_only_state, state_dict_checkpoint, workers
):
    with pytest.raises(ConfigError, match=r"not model\.pt.*\n.*HINT:.*model=MyModel\(\)"):
        phalanx.serve.serve(weights_only_state, "torch", port=0, workers=workers)
    with pytest.raises(ConfigError, match=r"state dict.*\n.*HINT:.*model=MyModel\(\)"):
        phalanx.serve.serve(state_dict_checkpoint, port=0, workers=workers)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serving_on_is_said_once_the_model_is_loaded_and_a_line_when_it_stops(
    runs, tmp_path, workers
):
    result = runs("torch")
    log = tmp_path / "serve.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]))
    args = [result.path, "--model", "serve_models:make_net", "--workers", workers, "--port", "0"]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "phalanx", "serve", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"Serving on (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # Said once the model is loaded: the first request after it is answered by the model.
        assert httpx.get(f"{found[1]}/readyz", timeout=30).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert text.count("Serving best checkpoint") == 1, text
    assert "SIGTERM: stopping" in text and text.rstrip().endswith("Stopped."), text
