"""Ray's persistence contract: the directory a user reports is theirs; files move only when
they allow it; empty reports fail at report(); mixed upload modes merge into one checkpoint;
no name can make phalanx write or delete outside ``<storage_path>/<name>``.

Workers are real processes (the local engine) wherever the behaviour involves them; the S3
cases run against a moto server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import uuid

import pytest
from _helpers import moto_s3

import phalanx as train
from phalanx import (
    Checkpoint,
    CheckpointConfig,
    CheckpointUploadMode,
    ConfigError,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    StorageError,
    TrainingFailedError,
)
from phalanx._foundation.fs import copy as local_copy
from phalanx._foundation.fs import paths
from phalanx._internal.storage import run_storage
from phalanx._internal.storage.run_storage import RunStorage


def tree(root):
    """Every file under ``root``: relative path -> (bytes, mode); directories as None."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = (f.read(), stat.S_IMODE(info.st_mode))
            else:
                out[os.path.relpath(path, root)] = stat.S_IFMT(info.st_mode)
    return out


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def run(loop, storage, name="exp", workers=2, engine=None, config=None, keep=None, fs=None):
    return DataParallelTrainer(
        loop,
        train_loop_config=config or {},
        scaling_config=ScalingConfig(num_workers=workers, engine=engine),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            storage_filesystem=fs,
            checkpoint_config=CheckpointConfig(num_to_keep=keep),
        ),
    ).fit()


# --------------------------------------------------------------------------- SYNC: a copy


def report_given_dirs(config):
    rank = train.get_context().get_world_rank()
    train.report(
        {"rank": rank},
        checkpoint=Checkpoint.from_directory(config["dirs"][rank]),
        checkpoint_upload_mode=config.get("mode", "sync"),
        delete_local_checkpoint_after_upload=config.get("delete"),
    )


def user_dirs(tmp_path, workers=2):
    dirs = []
    for rank in range(workers):
        d = tmp_path / f"user_{rank}"
        write(str(d / f"model_{rank}.pt"), os.urandom(300_000))
        write(str(d / "nested" / "opt.bin"), bytes([rank]) * 1000)
        os.chmod(d / f"model_{rank}.pt", 0o640)
        dirs.append(str(d))
    return dirs


@pytest.mark.slow
def test_sync_report_leaves_the_users_directory_exactly_as_written(tmp_path, storage):
    dirs = user_dirs(tmp_path)
    before = [tree(d) for d in dirs]
    result = run(report_given_dirs, storage, config={"dirs": dirs})
    assert [tree(d) for d in dirs] == before  # same files, same bytes, same modes
    committed = tree(result.checkpoint.path)
    for rank, original in enumerate(before):  # and both parts reached the checkpoint
        assert committed[f"model_{rank}.pt"] == original[f"model_{rank}.pt"]
    assert committed["nested/opt.bin"][0] in (b"\0" * 1000, b"\1" * 1000)


def report_shared_dir(config):
    shared = config["shared"]
    write(os.path.join(shared, "model.pt"), b"weights")  # Ray's getting-started pattern
    train.report({"a": 1}, checkpoint=Checkpoint.from_directory(shared))


@pytest.mark.slow
def test_a_shared_temp_dir_keeps_every_foreign_file_and_the_run_is_not_copied_into_itself(
    tmp_path,
):
    shared = tmp_path / "tmp"  # like tempfile.gettempdir(): other programs' files live here
    write(str(shared / "other.lock"), b"pid 4242")
    write(str(shared / "pip-cache" / "wheel.whl"), b"wheel")
    os.mkfifo(shared / "a_fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(shared / "a.sock"))
    try:
        before = tree(shared)
        # the default storage_path under the temp dir, as with ~/phalanx_results on a tmpfs home
        result = run(
            report_shared_dir, str(shared / "runs"), workers=1, config={"shared": str(shared)}
        )
    finally:
        sock.close()
    after = tree(shared)
    assert {k: v for k, v in after.items() if not k.startswith("runs")} == {
        **before,
        "model.pt": (b"weights", after["model.pt"][1]),
    }
    committed = tree(result.checkpoint.path)
    assert committed["model.pt"][0] == b"weights"
    assert committed["other.lock"][0] == b"pid 4242"  # copied, as Ray copies the directory
    assert "a_fifo" not in committed and "a.sock" not in committed  # no special files
    assert not any(k.startswith("runs") for k in committed)  # the run is not copied into itself


def test_async_refuses_to_delete_the_shared_temp_dir(tmp_path, storage, monkeypatch):
    shared = tmp_path / "tmp"
    write(str(shared / "other.lock"), b"pid 4242")
    monkeypatch.setattr(tempfile, "tempdir", str(shared))

    def loop():
        write(os.path.join(tempfile.gettempdir(), "model.pt"), b"w")
        train.report({}, checkpoint=Checkpoint.from_directory(tempfile.gettempdir()),
                     checkpoint_upload_mode="async")  # fmt: skip

    with pytest.raises(TrainingFailedError, match=r"(?s)shared with others.*HINT"):
        run(loop, storage, workers=1, engine="thread")
    assert tree(shared)["other.lock"][0] == b"pid 4242"
    assert (shared / "model.pt").exists()


def report_same_dir_twice(config):
    d = os.path.join(config["root"], f"rank_{train.get_context().get_world_rank()}")
    for step in range(2):
        os.makedirs(d, exist_ok=True)  # ASYNC (delete=True by default) removed it
        if step == 0:
            write(os.path.join(d, "model.pt"), b"step 0")
            write(os.path.join(d, "config.json"), b"{}")  # written once, in both checkpoints
        else:  # rewritten: the old file gone, a new one
            if os.path.exists(os.path.join(d, "model.pt")):
                os.remove(os.path.join(d, "model.pt"))
            write(os.path.join(d, "model_v2.pt"), b"step 1")
        train.report({"step": step}, checkpoint=Checkpoint.from_directory(d),
                     checkpoint_upload_mode=config["mode"])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_same_directory_reported_twice_gives_two_correct_checkpoints(tmp_path, storage, mode):
    result = run(report_same_dir_twice, storage, config={"root": str(tmp_path), "mode": mode})
    (m0, first), (m1, second) = sorted(
        ((m["step"], cp) for cp, m in result.best_checkpoints), key=lambda x: x[0]
    )
    assert (m0, m1) == (0, 1)
    assert {k: v[0] for k, v in tree(first.path).items()} == {
        "model.pt": b"step 0",
        "config.json": b"{}",
    }
    expected = {"model_v2.pt": b"step 1"}
    if mode == "sync":  # ASYNC removed the directory after step 0: config.json went with it
        expected["config.json"] = b"{}"
    assert {k: v[0] for k, v in tree(second.path).items()} == expected
    assert result.checkpoint == second
    survivors = os.path.join(str(tmp_path), "rank_0")
    # SYNC leaves the directory as the user left it; ASYNC (delete=True) removed it
    assert os.path.exists(survivors) == (mode == "sync")


# --------------------------------------------------------------------------- missing


def report_bad_dir(config):
    """Returns what report() raised, to prove it raised there (not later, on the driver)."""
    try:
        train.report({}, checkpoint=Checkpoint.from_directory(config["dir"]),
                     checkpoint_upload_mode=config["mode"])  # fmt: skip
    except (ValueError, FileNotFoundError) as exc:
        train.report({"error": f"{type(exc).__name__}: {exc}"})
        return str(exc)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", ["missing", "a_file"])
def test_a_missing_directory_fails_at_report_and_commits_nothing(tmp_path, storage, mode, kind):
    """(An empty directory is a checkpoint, as in Ray: tests/ray_compat/test_v2_ray_parity.py.)"""
    target = tmp_path / "ckpt"
    if kind == "a_file":
        target.write_text("not a directory")
    result = run(report_bad_dir, storage, workers=1, config={"dir": str(target), "mode": mode})
    assert "not a directory" in result.return_value and "HINT:" in result.return_value
    assert result.checkpoint is None
    assert not [n for n in os.listdir(result.path) if n.startswith("checkpoint_0")]
    assert result.metrics["error"].startswith("FileNotFoundError")


# --------------------------------------------------------------------------- ASYNC and delete


def report_with_delete(config):
    rank = train.get_context().get_world_rank()
    d = config["dirs"][rank]
    train.report({"rank": rank}, checkpoint=Checkpoint.from_directory(d),
                 checkpoint_upload_mode=config["mode"],
                 delete_local_checkpoint_after_upload=config["delete"])  # fmt: skip
    train.report({"after": True})  # rank's report order survives the background upload


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,delete,removed",
    [
        ("async", None, True),  # Ray's default for ASYNC: delete after upload
        ("async", True, True),
        ("async", False, False),
        ("sync", True, True),
        ("sync", None, False),
    ],
)
def test_delete_local_checkpoint_after_upload_decides_whether_the_directory_survives(
    tmp_path, storage, mode, delete, removed
):
    dirs = user_dirs(tmp_path)
    before = [tree(d) for d in dirs]
    result = run(report_with_delete, storage,
                 config={"dirs": dirs, "mode": mode, "delete": delete})  # fmt: skip
    assert [os.path.exists(d) for d in dirs] == [not removed] * 2
    if not removed:
        assert [tree(d) for d in dirs] == before
    committed = tree(result.checkpoint.path)
    for rank in range(2):
        assert committed[f"model_{rank}.pt"][0] == before[rank][f"model_{rank}.pt"][0]
    assert result.metrics == {"after": True}


def test_delete_refuses_a_directory_that_holds_the_run(tmp_path):
    def loop():
        write(os.path.join(str(tmp_path), "model.pt"), b"w")
        train.report({}, checkpoint=Checkpoint.from_directory(str(tmp_path)),
                     delete_local_checkpoint_after_upload=True)  # fmt: skip

    with pytest.raises(TrainingFailedError, match="holds the run directory"):
        run(loop, str(tmp_path / "runs"), workers=1, engine="thread")
    assert (tmp_path / "model.pt").exists()


# --------------------------------------------------------------------------- mixed upload modes

MODES = ("sync", "no_upload", "async")


def mixed_modes_loop(config):
    """Each round, each rank uses another upload mode; rank r writes shard_r. With
    ``named=False`` no rank passes checkpoint_dir_name: the NO_UPLOAD rank asks for the default."""
    ctx = train.get_context()
    rank, storage = ctx.get_world_rank(), ctx.get_storage()
    for step in range(3):
        mode = MODES[(rank + step) % 3]
        named = config.get("named", True)
        name = f"ckpt_step_{step}" if named else storage.make_default_checkpoint_dir_name()
        if mode == "no_upload":
            d = storage.build_checkpoint_path_from_name(name)
            storage.filesystem.makedirs(d, exist_ok=True)
            storage.filesystem.pipe(f"{d}/shard_{rank}", f"{step}:{rank}".encode())
        else:
            d = os.path.join(config["root"], f"r{rank}_s{step}")
            write(os.path.join(d, f"shard_{rank}"), f"{step}:{rank}".encode())
        train.report({"step": step}, checkpoint=Checkpoint.from_directory(d)
                     if mode != "no_upload" else Checkpoint(d, storage.filesystem),
                     checkpoint_dir_name=name if named else None,
                     checkpoint_upload_mode=mode)  # fmt: skip


def check_mixed(result, fs, named=True):
    assert sorted(m["step"] for _, m in result.best_checkpoints) == [0, 1, 2]
    for checkpoint, metrics in result.best_checkpoints:
        step = metrics["step"]
        name = f"ckpt_step_{step}" if named else f"checkpoint_{step:06d}"
        assert checkpoint.path.endswith(f"/{name}")
        shards = {p.rsplit("/", 1)[-1] for p in fs.ls(checkpoint.path, detail=False)}
        assert {f"shard_{r}" for r in range(3)} <= shards
        for rank in range(3):
            assert fs.cat(f"{checkpoint.path}/shard_{rank}") == f"{step}:{rank}".encode()


@pytest.mark.slow
@pytest.mark.parametrize("named", [True, False], ids=["same_dir_name", "default_dir_name"])
def test_sync_no_upload_and_async_ranks_in_one_round_commit_one_merged_checkpoint(
    tmp_path, storage, named
):
    import fsspec

    config = {"root": str(tmp_path), "named": named}
    result = run(mixed_modes_loop, storage, workers=3, config=config)
    check_mixed(result, fsspec.filesystem("file"), named)
    staging = os.path.join(result.path, ".staging")
    assert not os.path.exists(staging) or not os.listdir(staging)


def test_no_upload_with_another_checkpoint_dir_name_fails_at_report(storage):
    def loop():
        d = train.get_context().get_storage().build_checkpoint_path_from_name("a")
        write(os.path.join(d, "w"), b"x")
        train.report({}, checkpoint=Checkpoint.from_directory(d), checkpoint_dir_name="b",
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)  # fmt: skip

    with pytest.raises(TrainingFailedError, match="checkpoint_dir_name='b'"):
        run(loop, storage, workers=1, engine="thread")


# --------------------------------------------------------------------------- paths stay inside


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "../x", "a\\b", ".phalanx_lock", 3])
def test_run_config_refuses_a_name_that_is_not_one_directory(name):
    with pytest.raises(ConfigError, match=r"(?s)RunConfig\(name=.*HINT"):
        RunConfig(name=name)


BAD_DIR_NAMES = ["../x", "..", ".", "a/b", "/abs", "logs", ".staging", "metrics.jsonl",
                 "checkpoint_manager_snapshot.json", ".phalanx_upload", ""]  # fmt: skip


def report_bad_names(config):
    d = os.path.join(config["root"], f"rank_{train.get_context().get_world_rank()}")
    write(os.path.join(d, "w"), b"x")
    errors = []
    for name in config["names"]:
        try:
            train.report({}, checkpoint=Checkpoint.from_directory(d), checkpoint_dir_name=name)
        except ValueError as exc:
            errors.append(str(exc))
    train.report({"ok": True}, checkpoint=Checkpoint.from_directory(d), checkpoint_dir_name="ok")
    return errors


@pytest.mark.slow
def test_report_refuses_a_checkpoint_dir_name_outside_the_run_and_writes_nothing(tmp_path):
    storage = tmp_path / "runs"
    result = run(report_bad_names, str(storage), config={"root": str(tmp_path / "user"),
                                                          "names": BAD_DIR_NAMES})  # fmt: skip
    assert len(result.return_value) == len(BAD_DIR_NAMES)
    assert all("HINT:" in e for e in result.return_value)
    assert sorted(os.listdir(tmp_path)) == ["runs", "user"]  # no ../x
    assert sorted(os.listdir(storage)) == ["exp"]
    assert result.checkpoint.path.endswith("/exp/ok")
    assert [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints] == ["ok"]


def test_the_storage_layer_refuses_paths_that_leave_the_run(tmp_path):
    victim = tmp_path / "victim"
    write(str(victim / "precious"), b"keep")
    storage = RunStorage.create(str(tmp_path / "runs"), "exp")
    for bad in ("../../victim", "..", ".", "a/../../victim", ""):
        with pytest.raises(StorageError, match="Refusing"):
            storage.delete_checkpoint(bad)
        with pytest.raises(StorageError, match="Refusing"):
            storage.checkpoint_path(bad)
    with pytest.raises(StorageError, match="Refusing the run name"):
        RunStorage.create(str(tmp_path / "runs"), "..")
    assert (victim / "precious").read_bytes() == b"keep"


def crafted_snapshot_loop(config):
    d = os.path.join(config["root"], f"r{train.get_context().get_world_rank()}")
    for step in range(config["steps"]):
        write(os.path.join(d, "w"), str(step).encode())
        train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


def craft(snapshot: bytes) -> bytes:
    """Add an entry ``../victim`` that retention would evict first (the oldest round)."""
    state = json.loads(snapshot)
    state["checkpoints"].insert(0, {"dir_name": "../victim", "metrics": {}, "round": -1})
    return json.dumps(state).encode()


@pytest.mark.slow
def test_a_crafted_snapshot_entry_is_refused_and_retention_never_deletes_outside(tmp_path):
    storage = tmp_path / "runs"
    victim = storage / "victim"  # a sibling of the run: '../victim' seen from the run
    write(str(victim / "precious"), b"keep")
    config = {"root": str(tmp_path / "user"), "steps": 2}
    first = run(crafted_snapshot_loop, str(storage), keep=2, config=config)
    snapshot = os.path.join(first.path, run_storage.SNAPSHOT_FILE)
    with open(snapshot, "rb") as f:
        crafted = craft(f.read())
    with open(snapshot, "wb") as f:
        f.write(crafted)
    with pytest.raises(StorageError, match=r"(?s)'\.\./victim'.*Nothing was deleted.*HINT"):
        run(crafted_snapshot_loop, str(storage), keep=2, config={**config, "steps": 4})
    assert (victim / "precious").read_bytes() == b"keep"


def test_reserved_names_cover_every_entry_phalanx_keeps_in_a_run():
    kept = {
        run_storage.SNAPSHOT_FILE,
        run_storage.HISTORY_FILE,
        run_storage.ALL_RANKS_HISTORY_FILE,
        run_storage.STAGING_DIR,
        run_storage.LOG_DIR,
        run_storage.ERROR_TEXT_FILE,
        run_storage.ERROR_PICKLE_FILE,
        run_storage.MARKER_FILE,
    }
    assert all(paths.checkpoint_name_problem(n) for n in kept)
    assert paths.checkpoint_name_problem("checkpoint_000001") is None


# --------------------------------------------------------------------------- the same on S3

BUCKET = "phalanx-persist"


@pytest.fixture(scope="module")
def s3():
    with moto_s3(BUCKET) as fs:
        yield fs


def s3_run(loop, s3, config, workers=2, keep=None, name=None):
    return run(loop, f"s3://{BUCKET}/runs", name=name or f"exp-{uuid.uuid4().hex[:6]}",
               workers=workers, config=config, keep=keep, fs=s3)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,delete,removed",
    [("sync", None, False), ("async", None, True), ("async", False, False), ("sync", True, True)],
)
def test_s3_upload_modes_keep_or_remove_the_users_directory_as_asked(
    tmp_path, s3, mode, delete, removed
):
    dirs = user_dirs(tmp_path)
    before = [tree(d) for d in dirs]
    result = s3_run(report_with_delete, s3, {"dirs": dirs, "mode": mode, "delete": delete})
    assert [os.path.exists(d) for d in dirs] == [not removed] * 2
    if not removed:
        assert [tree(d) for d in dirs] == before
    for rank in range(2):
        data = s3.cat(f"{result.checkpoint.path}/model_{rank}.pt")
        assert data == before[rank][f"model_{rank}.pt"][0]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".phalanx-upload")]


@pytest.mark.slow
def test_s3_mixed_upload_modes_in_one_round_commit_one_merged_checkpoint(tmp_path, s3):
    result = s3_run(mixed_modes_loop, s3, {"root": str(tmp_path)}, workers=3)
    check_mixed(result, s3)


@pytest.mark.slow
def test_s3_crafted_snapshot_entry_never_deletes_a_sibling(tmp_path, s3):
    name = f"exp-{uuid.uuid4().hex[:6]}"
    s3.pipe(f"{BUCKET}/runs/victim/precious", b"keep")
    config = {"root": str(tmp_path / "user"), "steps": 2}
    s3_run(crafted_snapshot_loop, s3, config, workers=1, keep=2, name=name)
    snapshot = f"{BUCKET}/runs/{name}/{run_storage.SNAPSHOT_FILE}"
    s3.pipe(snapshot, craft(s3.cat(snapshot)))
    with pytest.raises(StorageError, match=r"'\.\./victim'"):
        s3_run(crafted_snapshot_loop, s3, {**config, "steps": 4}, workers=1, keep=2, name=name)
    assert s3.cat(f"{BUCKET}/runs/victim/precious") == b"keep"


# --------------------------------------------------------------------------- the copy itself


def test_copy_file_keeps_bytes_and_mode_whatever_method_the_filesystem_allows(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    data = os.urandom(3 << 20) + b"tail"
    src.write_bytes(data)
    os.chmod(src, 0o600)
    method = local_copy.copy_file(str(src), str(dst))
    assert method in ("reflink", "copy_file_range", "sendfile", "read_write")
    assert dst.read_bytes() == data and stat.S_IMODE(os.stat(dst).st_mode) == 0o600
    (tmp_path / "empty").write_bytes(b"")
    local_copy.copy_file(str(tmp_path / "empty"), str(tmp_path / "empty2"))
    assert (tmp_path / "empty2").read_bytes() == b""


def test_copy_file_falls_back_when_a_method_is_refused(tmp_path, monkeypatch):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"x" * 100_000)

    def refuse(*args):
        raise OSError(18, "Invalid cross-device link")  # EXDEV: not available here

    monkeypatch.setattr(local_copy, "_refused", {})
    monkeypatch.setattr(local_copy.fcntl, "ioctl", refuse)
    monkeypatch.setattr(local_copy.os, "copy_file_range", refuse)
    assert local_copy.copy_file(str(src), str(dst)) in ("sendfile", "read_write")
    assert dst.read_bytes() == b"x" * 100_000


def test_copy_tree_follows_links_skips_special_files_and_the_excluded_path(tmp_path):
    src = tmp_path / "src"
    write(str(src / "d" / "f"), b"f")
    os.symlink(src / "d" / "f", src / "link")
    os.mkfifo(src / "fifo")
    write(str(src / "storage" / "run" / "big"), b"must not be copied")
    n = local_copy.copy_tree(str(src), str(tmp_path / "dst"), exclude=str(src / "storage"))
    assert n == 2
    assert {k: v if v is None else v[0] for k, v in tree(tmp_path / "dst").items()} == {
        "d": None,
        "d/f": b"f",
        "link": b"f",
    }


def test_ranks_moving_same_named_subdirectories_into_one_part_at_once_merge_them(tmp_path):
    """Two ranks' parts both have ``nested/``: whichever rename lands second merges into it."""
    import threading

    from phalanx._foundation.fs.access import move_tree_contents

    for trial in range(150):
        root = tmp_path / str(trial)
        for rank in range(2):
            write(str(root / f"u{rank}" / "nested" / "deep" / f"f{rank}"), b"x")
        errors = []

        def move(rank, root=root, errors=errors):
            try:
                move_tree_contents(str(root / f"u{rank}"), str(root / "part"))
            except OSError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=move, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert sorted(os.listdir(root / "part" / "nested" / "deep")) == ["f0", "f1"]
