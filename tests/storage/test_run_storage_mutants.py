"""The run layout every store shares, pinned where mutation testing (``bench/mutation.py``) showed
the storage tests let a bug through: where a storage path puts the run, that a staged part is
never mistaken for a checkpoint of a resumed run, what the errors say when the run directory
cannot be written, read or cleaned (and that the user's file in the way is left alone), and a
checkpoint's metadata kept next to the one the commit adds.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from phalanx import Checkpoint, CheckpointConfig
from phalanx._internal.storage.checkpoint_manager import CheckpointManager
from phalanx._internal.storage.run_storage import RunStorage
from phalanx.errors import StorageError


@pytest.mark.parametrize("directory", ["runsX", "runs "], ids=["ends-in-X", "ends-in-space"])
def test_the_run_lives_in_the_storage_directory_exactly_as_named(
    tmp_path: Path, directory: str
) -> None:
    storage = RunStorage.create(str(tmp_path / directory), "exp")
    storage.prepare()
    assert storage.run_path == f"{tmp_path}/{directory}/exp"
    assert (tmp_path / directory / "exp" / ".phalanx_run").is_file()


def test_a_trailing_slash_or_the_root_names_the_same_directory(tmp_path: Path) -> None:
    given = RunStorage.create(f"{tmp_path}/runs/", "exp", filesystem=LocalFileSystem())
    assert given.run_path == f"{tmp_path}/runs/exp"
    at_root = RunStorage.create("/", "exp").run_path  # only computed: nothing is written there
    assert at_root == "/exp"  # as Ray writes it, not //exp


def test_a_staged_part_a_cut_off_commit_left_is_gone_when_the_run_resumes(tmp_path: Path) -> None:
    part = tmp_path / "user" / "rank0"
    part.mkdir(parents=True)
    (part / "model.bin").write_bytes(b"weights")
    first = RunStorage.create(str(tmp_path / "runs"), "exp")
    first.prepare()
    first.stage_part(Checkpoint.from_directory(str(part)), "checkpoint_000001", 0)
    assert first.staging_path("checkpoint_000001", 0) == (
        f"{first.run_path}/.staging/checkpoint_000001.0"
    )
    resumed = RunStorage.create(str(tmp_path / "runs"), "exp")  # the resumed run
    resumed.prepare()
    assert resumed.staged_names() == {"checkpoint_000001"}
    CheckpointManager(resumed, CheckpointConfig()).recover_unindexed()  # what fit() does next
    assert sorted(p.name for p in (tmp_path / "runs" / "exp").iterdir()) == [".phalanx_run"]
    assert (part / "model.bin").read_bytes() == b"weights"  # the user's copy stays


def test_a_refused_run_name_says_what_to_pass_instead(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as raised:
        RunStorage.create(str(tmp_path), "..")
    assert str(raised.value).endswith("\nHINT: RunConfig(name=...) takes a plain directory name.")


@pytest.mark.parametrize("name", ["a\\b", "..", "ok/../.."])
def test_a_checkpoint_name_that_could_leave_the_run_is_refused_with_a_hint(
    tmp_path: Path, name: str
) -> None:
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    with pytest.raises(StorageError) as raised:
        storage.checkpoint_path(name)
    assert str(raised.value) == (
        f"Refusing to touch {name!r} in the run directory {storage.run_path!r}: it is not a "
        "plain name, so the path could point outside the run.\n"
        "HINT: checkpoint names are single directory names such as 'epoch_3'."
    )


def test_a_checkpoint_path_built_from_a_name_is_inside_the_run_and_checked(
    tmp_path: Path,
) -> None:
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    assert storage.build_checkpoint_path_from_name("epoch_3") == f"{tmp_path}/runs/exp/epoch_3"
    with pytest.raises(ValueError, match=r"checkpoint_dir_name='\.\./x'.*\n.*HINT"):
        storage.build_checkpoint_path_from_name("../x")


def test_a_file_where_the_run_directory_goes_fails_prepare_and_is_kept(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "exp").write_bytes(b"the user's file")
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    with pytest.raises(StorageError) as raised:
        storage.prepare()
    assert str(raised.value).startswith(
        f"Could not write to the run directory {storage.run_uri!r}: FileExistsError"
    )
    assert (tmp_path / "runs" / "exp").read_bytes() == b"the user's file"


def _object_run() -> RunStorage:
    storage = RunStorage.create(f"memory://runs-{uuid.uuid4().hex[:8]}", "exp")
    storage.prepare()
    return storage


def _run(tmp_path: Path, where: str) -> RunStorage:
    if where == "object":
        return _object_run()
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    storage.prepare()
    return storage


def test_a_run_file_that_cannot_be_read_is_named_as_the_user_wrote_it() -> None:
    storage = _object_run()
    storage.filesystem.makedirs(storage.path("metrics.jsonl", "inside"), exist_ok=True)
    with pytest.raises(StorageError) as raised:
        storage.read("metrics.jsonl")
    uri = storage.uri(storage.path("metrics.jsonl"))
    assert uri.startswith("memory://")
    assert re.match(rf"Could not read {re.escape(repr(uri))}: \w+", str(raised.value))


@pytest.mark.parametrize("where", ["local", "object"])
def test_a_run_file_that_cannot_be_removed_is_named_and_a_directory_there_is_kept(
    tmp_path: Path, where: str
) -> None:
    storage = _run(tmp_path, where)
    fs = storage.filesystem
    kept = storage.path("error.txt")
    fs.makedirs(kept, exist_ok=True)
    fs.pipe(f"{kept}/notes", b"the user's notes")
    with pytest.raises(StorageError) as raised:
        storage.remove("error.txt")
    assert str(raised.value).startswith(f"Could not remove {storage.uri(kept)!r}: ")
    assert fs.cat(f"{kept}/notes") == b"the user's notes"


@pytest.mark.parametrize("where", ["local", "object"])
def test_a_checkpoints_own_metadata_is_kept_next_to_the_commits(tmp_path: Path, where: str) -> None:
    storage = _run(tmp_path, where)
    part = Checkpoint.from_directory(str(tmp_path / "rank0"))
    (tmp_path / "rank0").mkdir()
    part.set_metadata({"tokenizer": "bpe"})
    storage.stage_part(part, "checkpoint_000000", 0)
    final = storage.commit("checkpoint_000000", 0, {"epoch": 1})
    with storage.filesystem.open(f"{final}/.metadata.json", "r") as f:
        assert json.load(f) == {"epoch": 1, "tokenizer": "bpe"}
    assert fsspec.filesystem("file").exists(str(tmp_path / "rank0" / ".metadata.json"))
