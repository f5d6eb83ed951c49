"""The on_report hook and its steps; CSV, JSON and TensorBoard loggers on real runs; imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from tracker_files import csv_rows, import_tensorboard_reader, json_rows, tensorboard_scalars

import phalanx as train
from phalanx import Callback, Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.callbacks import ReportInfo
from phalanx.integrations import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

# tensorboardX sets CRC32C_SW_MODE in os.environ when imported: import it before the no_leaks
# fixture takes its snapshot (the package's own side effect, not phalanx's). Only the tests that
# write TensorBoard files need it: the hook tests and the missing-tracker errors run without.
try:
    import tensorboard.backend.event_processing.event_accumulator  # noqa: F401
    import tensorboardX  # noqa: F401
except ImportError:
    HAS_TENSORBOARD = False
else:
    HAS_TENSORBOARD = True
    import_tensorboard_reader()
needs_tensorboard = pytest.mark.skipif(
    not HAS_TENSORBOARD, reason="needs tensorboardX and tensorboard (phalanx[tensorboard])"
)


def train_fn(config):
    ctx = train.get_context()
    for epoch in range(config["epochs"]):
        metrics = {"loss": 1.0 / (epoch + 1), "rank": ctx.get_world_rank(), "nested": {"a": epoch}}
        if epoch == 2:
            metrics["late"] = "text"  # a column that first appears mid-run
        checkpoint = None
        if epoch == 1:
            d = tempfile.mkdtemp()
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(str(epoch))
            checkpoint = Checkpoint.from_directory(d)
        train.report(metrics, checkpoint=checkpoint)


def fit(storage, callbacks, epochs=3, name="run"):
    return DataParallelTrainer(
        train_fn,
        train_loop_config={"epochs": epochs, "lr": 0.1, "opt": {"name": "sgd"}},
        scaling_config=ScalingConfig(num_workers=2, engine="thread"),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks),
    ).fit()


class Recorder(Callback):
    def __init__(self):
        self.infos: list[ReportInfo] = []
        self.ray_style: list[list[dict]] = []

    def after_report(self, run_context, metrics, checkpoint):  # Ray's signature, unchanged
        self.ray_style.append(metrics)

    def on_report(self, run_context, report):
        self.infos.append(report)


def test_on_report_gets_step_round_attempt_and_every_ranks_metrics(storage):
    recorder = Recorder()
    fit(storage, [recorder])
    assert [i.step for i in recorder.infos] == [1, 2, 3]
    assert [i.training_iteration for i in recorder.infos] == [1, 2, 3]
    assert {i.attempt for i in recorder.infos} == {0}
    assert [[m["rank"] for m in i.metrics] for i in recorder.infos] == [[0, 1]] * 3
    assert [i.run_metrics["loss"] for i in recorder.infos] == [1.0, 0.5, 1 / 3]
    assert [i.checkpoint is not None for i in recorder.infos] == [False, True, False]
    assert recorder.ray_style == [i.metrics for i in recorder.infos]


def test_a_resumed_run_continues_the_step(storage):
    first = Recorder()
    fit(storage, [first], epochs=2)
    second = Recorder()
    fit(storage, [second], epochs=2)  # same name: the run directory is continued
    assert [i.step for i in first.infos] == [1, 2]
    assert [i.step for i in second.infos] == [3, 4]


@needs_tensorboard
def test_csv_json_and_tensorboard_files(storage):
    fit(storage, [CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback()])
    run = os.path.join(storage, "run")

    rows = csv_rows(os.path.join(run, "progress.csv"))
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert [r["loss"] for r in rows] == ["1.0", "0.5", str(1 / 3)]
    assert [r["nested/a"] for r in rows] == ["0", "1", "2"]
    assert [r["late"] for r in rows] == ["", "", "text"]  # the header grew, no row was lost
    assert [r["checkpoint_dir_name"] for r in rows][1].startswith("checkpoint_")

    lines = json_rows(os.path.join(run, "result.json"))
    assert [(r["step"], r["training_iteration"], r["attempt"]) for r in lines] == [
        (1, 1, 0),
        (2, 2, 0),
        (3, 3, 0),
    ]
    assert lines[0]["nested"] == {"a": 0}
    with open(os.path.join(run, "params.json")) as f:
        assert json.load(f) == {"epochs": 3, "lr": 0.1, "opt": {"name": "sgd"}}

    scalars = tensorboard_scalars(os.path.join(run, "tensorboard"))
    assert scalars["loss"] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert scalars["nested/a"] == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert scalars["training_iteration"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert "late" not in scalars  # text is for CSV/JSON


@needs_tensorboard
def test_trackers_on_remote_storage_upload_their_files():
    import fsspec

    fs = fsspec.filesystem("memory")
    storage = "memory://phalanx-trackers-test"
    try:
        fit(storage, [CSVLoggerCallback(), JsonLoggerCallback(), TBXLoggerCallback()])
        run = "/phalanx-trackers-test/run"
        assert fs.cat(f"{run}/progress.csv").decode().count("\n") == 4
        assert fs.cat(f"{run}/result.json").decode().count("\n") == 3
        assert fs.exists(f"{run}/params.json")
        events = fs.ls(f"{run}/tensorboard", detail=False)
        assert len(events) == 1 and "tfevents" in events[0]
        assert fs.size(events[0]) > 0
    finally:
        fs.rm("/phalanx-trackers-test", recursive=True)


def test_import_phalanx_imports_no_tracker_package():
    code = (
        "import sys, phalanx, phalanx.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'tensorboardX', 'tensorboard', 'mlflow', 'wandb'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "make", "extra"),
    [
        ("tensorboardX", lambda i: i.TBXLoggerCallback(), "tensorboard"),
        ("mlflow", lambda i: i.MLflowLoggerCallback(), "mlflow"),
        ("mlflow", lambda i: i.setup_mlflow(), "mlflow"),
        ("wandb", lambda i: i.WandbLoggerCallback(), "wandb"),
        ("wandb", lambda i: i.setup_wandb(), "wandb"),
    ],
)
def test_a_missing_tracker_names_the_extra(monkeypatch, module, make, extra):
    import phalanx.integrations as integrations

    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like
    with pytest.raises(ModuleNotFoundError, match=rf'pip install "phalanx\[{extra}\]"') as info:
        make(integrations)
    assert "HINT:" in str(info.value)
