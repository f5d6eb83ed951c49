"""The Checkpoint handle: a local directory used in place, a remote one downloaded on demand."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import fsspec
import pytest

from phalanx import Checkpoint


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
