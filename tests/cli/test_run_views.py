"""What the `phalanx` command shows of runs a new user made: a GBDT trainer's own arguments in
run.json (and so in `show` and `compare`), dates in `metrics`, `ls` with no path, integer rounds
on a plot's x axis."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from phalanx import RunConfig, ScalingConfig
from phalanx.cli import main

pytest.importorskip("xgboost")


def frame(rows: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=rows), rng.normal(size=rows)
    return pd.DataFrame({"a": a, "b": b, "y": (a + b > 0).astype(int)})


@pytest.fixture(scope="module")
def gbdt_runs(tmp_path_factory):
    """Two XGBoost runs in <home>/phalanx_results: depth 2 for 3 rounds, depth 4 for the
    default number of rounds (not passed)."""
    from phalanx.xgboost import XGBoostTrainer

    home = tmp_path_factory.mktemp("home")
    storage = home / "phalanx_results"
    for name, params, rounds in (("shallow", 2, {"num_boost_round": 3}), ("deep", 4, {})):
        XGBoostTrainer(
            datasets={"train": frame()},
            label_column="y",
            params={"objective": "binary:logistic", "max_depth": params},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name=name, storage_path=str(storage), verbose=0),
            **rounds,
        ).fit()
    return home


def test_run_json_keeps_a_gbdt_trainers_arguments_and_show_and_compare_list_them(gbdt_runs, capsys):
    runs = gbdt_runs / "phalanx_results"
    record = json.loads((runs / "shallow" / "run.json").read_text())
    assert record["trainer"] == {
        "type": "phalanx.xgboost.XGBoostTrainer",
        "label_column": "y",
        "params": {"objective": "binary:logistic", "max_depth": 2},
        "num_boost_round": 3,
    }
    defaulted = json.loads((runs / "deep" / "run.json").read_text())["trainer"]
    assert defaulted["num_boost_round"] == 10  # what it ran with, though not passed

    assert main(["show", str(runs / "shallow")]) == 0
    shown = capsys.readouterr().out
    assert "trainer.params.max_depth = 2" in shown and "trainer.num_boost_round = 3" in shown
    assert main(["compare", str(runs / "shallow"), str(runs / "deep")]) == 0
    rows = {line.split()[1]: line.split()[2:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("*")}  # fmt: skip
    assert rows["trainer.params.max_depth"] == ["2", "4"]
    assert rows["trainer.num_boost_round"] == ["3", "10"]
    assert "trainer.label_column" not in rows  # the same in both


def test_metrics_prints_dates_not_seconds_since_1970(gbdt_runs, capsys):
    assert main(["metrics", str(gbdt_runs / "phalanx_results" / "shallow")]) == 0
    table = capsys.readouterr().out
    header, *rows = table.splitlines()
    assert "timestamp" in header and "attempt" in header and "_phalanx" not in header
    assert len(rows) == 3
    assert all(re.search(r" 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d ", row) for row in rows), table
    assert not re.search(r"\d{10}\.\d", table)


def test_ls_without_a_path_lists_the_default_storage_path(gbdt_runs, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(gbdt_runs))
    monkeypatch.delenv("PHALANX_STORAGE_PATH", raising=False)
    assert main(["ls"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert sorted(names) == ["deep", "shallow"]
    monkeypatch.setenv("PHALANX_STORAGE_PATH", str(gbdt_runs / "elsewhere"))
    assert main(["ls"]) == 2  # the variable wins, as for RunConfig
    assert "elsewhere" in capsys.readouterr().err


def test_a_plot_of_rounds_has_integer_ticks(tmp_path):
    pytest.importorskip("matplotlib")
    from phalanx.cli._plot import Curve, build_figure

    figure = build_figure({"loss": [Curve("run", "loss", [1, 2, 3], [0.9, 0.5, 0.3])]})
    (axes,) = [ax for ax in figure.axes if ax.get_visible()]
    ticks = axes.xaxis.get_major_locator()()
    inside = [t for t in ticks if 1 <= t <= 3]
    assert inside and all(float(t).is_integer() for t in ticks), ticks
    figure = build_figure({"loss": [Curve("run", "loss", [0.5, 1.0, 1.5], [0.9, 0.5, 0.3])]})
    ticks = figure.axes[0].xaxis.get_major_locator()()  # not rounds: matplotlib's own ticks
    assert not all(float(t).is_integer() for t in ticks)
