"""A small checkpoint is as durable as a big one: every file of it, the metadata and the files
phalanx adds (a preprocessor) included, is flushed before the rename that makes it visible.

The flush of a commit takes three paths by size (one syncfs, fsyncs in threads, fsyncs in a row
for one or two paths); the shortest path and the files the driver writes itself are what these
tests pin: a checkpoint of one file, and one with metadata and a preprocessor added at commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phalanx import Checkpoint
from phalanx._internal.storage.run_storage import RunStorage

DIR_NAME = "checkpoint_000000"


def _one_file_part(tmp_path: Path) -> RunStorage:
    storage = RunStorage.create(str(tmp_path / "runs"), "run")
    storage.prepare()
    part = tmp_path / "part"
    part.mkdir()
    (part / "model.pt").write_bytes(b"weights")
    storage.stage_part(Checkpoint.from_directory(str(part)), DIR_NAME, 0)
    return storage


def _record_flushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync (by the path its descriptor names) and rename, in the order they happen."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def rename(src: str, dst: str) -> None:
        events.append(("rename", dst))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    return events


def _flushed_before_visible(events: list[tuple[str, str]], final: str) -> set[str]:
    renamed = events.index(("rename", final))
    assert events[renamed + 1 :] == [("fsync", os.path.dirname(final))]  # the new name, last
    return {path for kind, path in events[:renamed] if kind == "fsync"}


def test_a_one_file_checkpoint_is_flushed_before_it_is_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _one_file_part(tmp_path)
    events = _record_flushes(monkeypatch)
    final = storage.commit(DIR_NAME, 0, None)
    staged = storage.staging_path(DIR_NAME, 0)
    assert _flushed_before_visible(events, final) == {f"{staged}/model.pt", staged}
    assert (Path(final) / "model.pt").read_bytes() == b"weights"


def test_metadata_and_a_preprocessor_are_flushed_with_the_checkpoint_before_it_is_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = _one_file_part(tmp_path)
    events = _record_flushes(monkeypatch)
    final = storage.commit(DIR_NAME, 0, {"epoch": 3}, {"preprocessor.pkl": b"fitted scaler"})
    staged = storage.staging_path(DIR_NAME, 0)
    written = {f"{staged}/{name}" for name in ("model.pt", ".metadata.json", "preprocessor.pkl")}
    assert written | {staged} <= _flushed_before_visible(events, final)
    assert json.loads((Path(final) / ".metadata.json").read_text()) == {"epoch": 3}
    assert (Path(final) / "preprocessor.pkl").read_bytes() == b"fitted scaler"
