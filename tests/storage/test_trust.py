"""Trust boundaries: nothing in a run directory is unpickled unless the user asks, and logs of a
run on remote storage go to a private directory, never a fixed shared path."""

from __future__ import annotations

import glob
import os
import pickle
import stat
import tempfile
import uuid
from pathlib import Path

import pytest
from _helpers import fit_on_thread_engine

import phalanx as train
from phalanx import DataParallelTrainer, Result, RunConfig, ScalingConfig, TrainingFailedError


class _Planted:
    """What someone else could leave as error.pkl: unpickling it runs their code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_touch, (self.marker,))


def _touch(path: str) -> ValueError:
    with open(path, "w") as f:
        f.write("code from the run directory ran")
    return ValueError("planted")


def test_from_path_reads_error_txt_and_unpickles_only_on_request(storage, tmp_path):
    def fails():
        raise RuntimeError("the loss exploded")

    with pytest.raises(TrainingFailedError) as info:
        fit_on_thread_engine(fails, storage, "failed")
    run_dir = info.value.result.path
    marker = str(tmp_path / "marker")
    with open(os.path.join(run_dir, "error.pkl"), "wb") as f:
        pickle.dump(_Planted(marker), f)

    result = Result.from_path(run_dir)
    assert not os.path.exists(marker)  # before: error.pkl was unpickled by default
    assert isinstance(result.error, TrainingFailedError)
    assert "RuntimeError: the loss exploded" in str(result.error)
    assert result.error.result is result

    trusted = Result.from_path(run_dir, load_error_pickle=True)  # the user's explicit choice
    assert os.path.exists(marker)
    assert str(trusted.error) == "planted"


def test_a_run_that_did_not_fail_has_no_error_after_from_path(storage):
    result = fit_on_thread_engine(lambda: None, storage, "fine")
    assert Result.from_path(result.path).error is None


@pytest.mark.slow
def test_remote_storage_logs_go_to_a_private_directory_not_a_planted_symlink(tmp_path, monkeypatch):
    name = f"logs-{uuid.uuid4().hex[:8]}"
    # Another local user pre-creates the old, predictable log path as a symlink to their target
    # (in a temp directory of this test's own: the shared /tmp/phalanx_logs is left alone).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    old_parent = os.path.join(tempfile.gettempdir(), "phalanx_logs")
    os.makedirs(old_parent)
    target = tmp_path / "attacker_target"
    target.mkdir()
    planted = os.path.join(old_parent, name)
    os.symlink(target, planted)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def loop():
        print("hello from the worker", flush=True)
        train.report({"a": 1})

    try:
        DataParallelTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=1, engine="local"),
            run_config=RunConfig(name=name, storage_path=f"memory://runs-{name}"),
        ).fit()
    finally:
        os.unlink(planted)
    assert os.listdir(target) == []  # before: rank_0.log was appended there
    logs = glob.glob(str(tmp_path / "cache" / "phalanx" / "logs" / f"{name}-*" / "rank_0.log"))
    assert len(logs) == 1
    assert "hello from the worker" in Path(logs[0]).read_text()
    mode = stat.S_IMODE(os.stat(os.path.dirname(logs[0])).st_mode)
    assert mode == 0o700
