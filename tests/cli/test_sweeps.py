"""`phalanx ls` lists sweeps after runs, `phalanx show <sweep>` prints its trials table and
`phalanx compare <sweep>` its trials side by side (a sweep made by phalanx.tune)."""

from __future__ import annotations

from phalanx import tune
from phalanx.cli import main
from phalanx.tune.schedulers import ASHAScheduler


def objective(config):
    for step in range(1, 5):
        tune.report({"loss": (config["lr"] - 0.2) ** 2 + 1 / step, "acc": step / 4})


def test_ls_show_and_compare_a_sweep(tmp_path, capsys):
    storage = str(tmp_path)
    tune.Tuner(
        objective,
        param_space={"lr": tune.grid_search([0.2, 0.9, 0.5]), "bs": 8},
        tune_config=tune.TuneConfig(
            scheduler=ASHAScheduler(metric="loss", mode="min", max_t=4, reduction_factor=2)
        ),
        run_config=tune.RunConfig(name="lr_sweep", storage_path=storage),
    ).fit()
    capsys.readouterr()

    assert main(["ls", storage]) == 0
    out = capsys.readouterr().out
    assert "SWEEP" in out and "lr_sweep" in out and "3/3" in out and "AsyncHyperBand" in out
    assert "loss=0.25" in out  # the best trial's best value: lr=0.2 at step 4

    assert main(["show", str(tmp_path / "lr_sweep")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "Sweep lr_sweep: FINISHED" in lines[0]
    header = next(line for line in lines if line.startswith("TRIAL"))
    assert "BEST loss" in header and "lr" in header and "bs" in header
    rows = [line.split() for line in lines if "_0000" in line and "TERMINATED" in line]
    assert [row[-2] for row in rows] == ["8", "8", "8"] and len(rows) == 3
    assert any("(stopped)" in line for line in lines)  # ASHA stopped lr=0.9

    assert main(["compare", str(tmp_path / "lr_sweep")]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:3] == ["TRIAL", "STATUS", "ITER"] and "lr" in header and "bs" not in header
    assert "acc" in header and "loss" in header
