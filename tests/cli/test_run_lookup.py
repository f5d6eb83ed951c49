"""Every command that takes a run finds it by the name `phalanx ls` prints, in the default storage
($PHALANX_STORAGE_PATH or ~/phalanx_results, a URI too), as well as by path; a name that matches
nothing is answered with the near names."""

from __future__ import annotations

import os
import tempfile

import pytest
from _helpers import fit_on_thread_engine

import phalanx as train
from phalanx import Checkpoint
from phalanx.cli import main


def loop(config=None):
    for step in range(3):
        train.report({"step": step, "loss": 1.0 / (step + 1)})


def loop_with_checkpoint(config=None):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "weights.txt"), "w") as f:
            f.write("1")
        train.report({"loss": 0.5}, checkpoint=Checkpoint.from_directory(d))


@pytest.fixture
def default_storage(tmp_path, monkeypatch):
    """A default storage with runs 'demo' and 'demo-lr', and a working directory elsewhere."""
    storage = tmp_path / "results"
    monkeypatch.setenv("PHALANX_STORAGE_PATH", str(storage))
    fit_on_thread_engine(loop, str(storage), "demo")
    fit_on_thread_engine(loop, str(storage), "demo-lr")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return storage


def test_show_metrics_plot_and_compare_find_a_run_by_its_name(default_storage, capsys):
    assert main(["ls"]) == 0
    assert "demo-lr" in capsys.readouterr().out
    assert main(["show", "demo"]) == 0
    assert f"run:          {default_storage}/demo" in capsys.readouterr().out
    assert main(["metrics", "demo"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["step", "loss"]
    assert main(["plot", "demo", "-m", "loss"]) == 0
    assert "loss" in capsys.readouterr().out
    assert main(["compare", "demo", "demo-lr"]) == 0
    assert "demo-lr" in capsys.readouterr().out
    assert main(["logs", "demo"]) == 2  # the thread engine writes no rank logs: found, then said
    assert "has no logs" in capsys.readouterr().err


def test_a_name_that_matches_nothing_lists_the_near_names(default_storage, capsys):
    assert main(["show", "dmeo"]) == 2
    err = capsys.readouterr().err
    assert "No run at 'dmeo'" in err and str(default_storage) in err
    assert "HINT: did you mean demo" in err and "demo-lr" in err
    assert main(["metrics", "zzz"]) == 2
    assert "`phalanx ls` lists the 2 run(s) there" in capsys.readouterr().err


def test_a_run_directory_here_comes_first_and_a_plain_directory_does_not_hide_a_run(
    default_storage, tmp_path, capsys
):
    fit_on_thread_engine(loop, os.getcwd(), "demo-lr")  # ./demo-lr is a run: it wins
    assert main(["show", "demo-lr"]) == 0
    assert f"run:          {tmp_path / 'work' / 'demo-lr'}" in capsys.readouterr().out
    os.mkdir("demo")  # a folder of the user's own, not a run: the stored run is found
    assert main(["show", "demo"]) == 0
    assert f"run:          {default_storage}/demo" in capsys.readouterr().out


def test_serve_finds_a_run_or_a_checkpoint_by_name(default_storage, capsys):
    result = fit_on_thread_engine(loop_with_checkpoint, str(default_storage), "ckpt")
    # It got to the run (and its checkpoint): what stops it is the checkpoint's missing model.
    assert main(["serve", "ckpt"]) == 2
    assert "--predictor" in capsys.readouterr().err
    name = os.path.basename(result.checkpoint.path)
    assert main(["serve", f"ckpt/{name}"]) == 2
    assert "--predictor" in capsys.readouterr().err
    assert main(["serve", "ckpz"]) == 2
    assert "HINT: did you mean ckpt" in capsys.readouterr().err


def test_a_default_storage_on_an_object_store_is_searched_too(tmp_path, monkeypatch, capsys):
    storage = "memory://lookup-test/runs"
    monkeypatch.setenv("PHALANX_STORAGE_PATH", storage)
    monkeypatch.chdir(tmp_path)
    fit_on_thread_engine(loop, storage, "remote")
    assert main(["show", "remote"]) == 0
    assert "run:          memory://lookup-test/runs/remote" in capsys.readouterr().out
    assert main(["show", "remot"]) == 2
    assert "did you mean remote" in capsys.readouterr().err
