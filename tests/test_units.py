"""Pure pieces: rank assignment, the Checkpoint handle, error grouping."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import fsspec
import pytest

from phalanx import Checkpoint, WorkerFailure, WorkerGroupError
from phalanx._internal.engines.base import WorkerMetadata
from phalanx._internal.worker_group.ranks import assign_ranks


def meta(node):
    return WorkerMetadata(host=node, node_id=node, pid=None)


def test_ranks_group_workers_by_node_like_torchrun():
    ranks = assign_ranks([meta("a"), meta("b"), meta("a"), meta("b"), meta("c")])
    assert [(r.world_rank, r.node_rank, r.local_rank, r.local_world_size) for r in ranks] == [
        (0, 0, 0, 2),
        (2, 1, 0, 2),
        (1, 0, 1, 2),
        (3, 1, 1, 2),
        (4, 2, 0, 1),
    ]


def test_checkpoint_from_directory_round_trips_files_and_metadata(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pt").write_bytes(b"weights")
    checkpoint = Checkpoint.from_directory(src)
    checkpoint.set_metadata({"epoch": 3})
    checkpoint.update_metadata({"lr": 0.1})
    assert checkpoint.get_metadata() == {"epoch": 3, "lr": 0.1}
    with checkpoint.as_directory() as d:
        assert d == str(src)  # local: no copy
    out = checkpoint.to_directory(tmp_path / "out")
    assert Path(os.path.join(out, "model.pt")).read_bytes() == b"weights"
    assert pickle.loads(pickle.dumps(checkpoint)) == checkpoint
    with pytest.raises(TypeError, match="as_directory"):
        os.fspath(checkpoint)


def test_a_remote_checkpoint_is_downloaded_for_as_directory():
    fs = fsspec.filesystem("memory")
    fs.pipe("/ckpts/c1/model.pt", b"remote weights")
    checkpoint = Checkpoint("memory://ckpts/c1")
    with checkpoint.as_directory() as d:
        assert Path(os.path.join(d, "model.pt")).read_bytes() == b"remote weights"
    assert not os.path.exists(d)
    assert repr(checkpoint) == "Checkpoint(path='memory:///ckpts/c1')"


def test_failures_are_grouped_across_ranks_and_pickle():
    failures = {
        r: WorkerFailure(r, "exception", "ValueError", f"bad value {r}", "Traceback...", time=r)
        for r in (0, 1, 3)
    }
    error = WorkerGroupError(failures)
    assert "[rank 0, 1, 3] ValueError: bad value 0" in str(error)
    assert "Root cause (earliest failure), rank 0" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.worker_failures.keys() == failures.keys()


def test_cli_shows_a_run_and_its_metrics(tmp_path, capsys):
    import phalanx as train
    from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
    from phalanx.cli import main

    def loop():
        for step in range(3):
            train.report({"step": step, "loss": 1.0 / (step + 1)})

    result = DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1, engine="thread"),
        run_config=RunConfig(name="cli", storage_path=str(tmp_path)),
    ).fit()
    assert main(["show", result.path]) == 0
    out = capsys.readouterr().out
    assert "attempts:     1" in out and "step=2" in out
    assert main(["metrics", result.path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["step", "loss"] and len(lines) == 4
    assert main(["show", str(tmp_path / "nope")]) == 2
    assert "No run at" in capsys.readouterr().err
