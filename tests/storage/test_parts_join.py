"""Two ranks' parts of one checkpoint meet in one staging directory: a part moved there (ASYNC,
or delete-after-upload) joins the directory another rank has just created, never replaces it.

A directory renamed onto an existing empty directory replaces it. A rank that had created the
staging directory for its own part (SYNC copies into it) then wrote into a directory that no
longer existed: FileNotFoundError, and the run failed (seen in CI with ASYNC + SYNC ranks).
"""

from __future__ import annotations

import os
from pathlib import Path

from phalanx._foundation.fs.access import move_tree_contents
from phalanx._internal.storage.local_store import _move_dir


def _part(root: Path, rank: int) -> Path:
    part = root / f"rank_{rank}_tmp"
    (part / "shards").mkdir(parents=True)
    (part / f"rank_{rank}").write_text(str(rank))
    (part / "shards" / f"shard_{rank}").write_text(str(rank))
    return part


def test_a_moved_part_joins_the_directory_another_rank_just_created(tmp_path: Path) -> None:
    staged = tmp_path / "staging" / "checkpoint_000000"
    staged.mkdir(parents=True)  # rank 1 (SYNC) created it and is about to copy into it
    inode = os.stat(staged).st_ino
    _move_dir(str(_part(tmp_path, 0)), str(staged))  # rank 0 (ASYNC) moves its part in
    assert os.stat(staged).st_ino == inode  # the same directory: rank 1's writes land in it
    (staged / "rank_1").write_text("1")
    assert sorted(os.listdir(staged)) == ["rank_0", "rank_1", "shards"]


def test_a_moved_subdirectory_joins_the_one_another_rank_just_created(tmp_path: Path) -> None:
    staged = tmp_path / "checkpoint_000000"
    (staged / "shards").mkdir(parents=True)  # another rank's (still empty) subdirectory
    inode = os.stat(staged / "shards").st_ino
    move_tree_contents(str(_part(tmp_path, 0)), str(staged))
    assert os.stat(staged / "shards").st_ino == inode
    assert os.listdir(staged / "shards") == ["shard_0"]


def test_a_part_alone_still_moves_in_one_rename(tmp_path: Path) -> None:
    part = _part(tmp_path, 0)
    inode = os.stat(part).st_ino
    staged = tmp_path / "staging" / "checkpoint_000000"
    _move_dir(str(part), str(staged))
    assert os.stat(staged).st_ino == inode and not part.exists()  # renamed, not copied
