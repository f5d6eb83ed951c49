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


@pytest.mark.parametrize(
    "message",
    [
        "UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error [127.0.0.1]:36494: "
        "Connection reset by peer",  # JAX over gloo
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:50105",  # torch DDP over gloo
        "NCCL error: remote process exited or there was a network error",
    ],
)
def test_the_rank_killed_is_the_root_cause_even_when_its_peer_s_error_is_seen_first(message):
    # Rank 1 was SIGKILLed; rank 0's collective then failed, and rank 0's exception reached the
    # driver 30 ms before the fork server reaped rank 1.
    failures = {
        0: WorkerFailure(0, "exception", "RuntimeError", message, "Traceback...", time=100.00),
        1: WorkerFailure(1, "signal", "WorkerKilled", "signal 9", signal=9, pid=7, time=100.03),
    }
    text = str(WorkerGroupError(failures))
    assert "Root cause (earliest failure), rank 1:" in text
    assert "killed by signal 9 (SIGKILL)" in text.split("Root cause")[1]


def test_a_rank_s_own_error_stays_the_root_cause_before_a_peer_s_death():
    # Rank 0 raised in user code; JAX then aborted rank 1 for losing its coordinator.
    failures = {
        0: WorkerFailure(0, "exception", "ValueError", "loss is nan", "Traceback...", time=100.0),
        1: WorkerFailure(1, "signal", "WorkerKilled", "signal 6", signal=6, time=100.03),
    }
    assert "Root cause (earliest failure), rank 0:" in str(WorkerGroupError(failures))
    # and a lost-peer error with no one else to blame is still named
    alone = {0: WorkerFailure(0, "exception", "RuntimeError", "Connection reset by peer")}
    assert "Root cause (earliest failure), rank 0:" in str(WorkerGroupError(alone))


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
