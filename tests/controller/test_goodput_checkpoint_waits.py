"""Goodput's checkpoint part on real worker processes: an ASYNC upload the next report() waits
for, and ``save_state``'s hold on the training thread, are counted; every committed checkpoint's
bytes are counted too, in ``Result.goodput``, ``run.json``, the end-of-fit line and the
Prometheus endpoint (scraped during the run)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from prometheus_client.parser import text_string_to_metric_families

import phalanx as train
from phalanx import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from phalanx.result import Result

pytestmark = pytest.mark.slow

UPLOAD_DELAY_S = 0.25  # each file an ASYNC upload reads
STEPS = 4
DEADLINE_S = 60.0


class SlowMemoryFileSystem(MemoryFileSystem):
    """fsspec's in-memory filesystem whose reads into local files take ``UPLOAD_DELAY_S``: a
    checkpoint on a slow remote filesystem, uploaded in the background."""

    protocol = "phalanxslowmemory"

    def get_file(self, rpath, lpath, *args, **kwargs):
        time.sleep(UPLOAD_DELAY_S)
        return super().get_file(rpath, lpath, *args, **kwargs)


def fit(loop, tmp_path: Path, name: str, workers: int = 1, **config) -> Result:
    return DataParallelTrainer(
        loop,
        train_loop_config={"dir": str(tmp_path), **config},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs")),
    ).fit()


def async_upload_loop(config):
    """Reports back to back, each with a checkpoint whose upload is slow: from the second on,
    report() waits for the previous upload. Writes how long each report() blocked."""
    fs = SlowMemoryFileSystem()
    blocked = []
    for step in range(STEPS):
        path = f"/phalanx-goodput/{os.getpid()}/step{step}"
        fs.pipe(f"{path}/weights.bin", b"x" * 1000)
        checkpoint = Checkpoint(path, filesystem=fs)
        asked = time.perf_counter()
        train.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_mode="async")
        blocked.append(time.perf_counter() - asked)
    Path(config["dir"], "blocked.json").write_text(json.dumps(blocked))


def test_waiting_for_a_previous_async_upload_counts_as_checkpoint_time(tmp_path):
    goodput = fit(async_upload_loop, tmp_path, "async").goodput
    blocked = json.loads((tmp_path / "blocked.json").read_text())
    assert sum(blocked[1:]) >= (STEPS - 1) * UPLOAD_DELAY_S / 2, blocked  # injected: it waited
    # report() returns at once in ASYNC mode: without the wait counted, the part is ~0
    assert goodput.seconds["checkpoints"] >= 0.8 * sum(blocked[1:]), (goodput.seconds, blocked)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s, rel=0.02)


def save_state_loop(config):
    """``save_state`` of a 32 MB tensor every step, one snapshot in flight (``max_pending=1``):
    each call copies the tensor, and from the second on waits for the previous write."""
    import torch

    from phalanx.torch import save_state

    state = {"weights": torch.ones(8 * 1024 * 1024)}
    held = []
    for step in range(STEPS):
        asked = time.perf_counter()
        checkpoint = save_state(state)
        held.append(time.perf_counter() - asked)
        train.report({"step": step}, checkpoint=checkpoint)
    Path(config["dir"], "held.json").write_text(json.dumps(held))


def test_the_training_thread_held_by_save_state_counts_as_checkpoint_time(tmp_path):
    pytest.importorskip("torch")
    goodput = fit(save_state_loop, tmp_path, "state").goodput
    held = json.loads((tmp_path / "held.json").read_text())
    assert sum(held) > 0.0
    assert goodput.seconds["checkpoints"] >= 0.8 * sum(held), (goodput.seconds, held)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s, rel=0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, run: str) -> dict[str, float]:
    """The run's samples by name ({} while the endpoint does not serve yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("run") == run
    }


def sized_loop(config):
    """Rank r writes (r + 1) kB per step into each checkpoint; after the last report it waits
    until the test has scraped the endpoint."""
    rank = train.get_context().get_world_rank()
    for step in range(STEPS):
        with tempfile.TemporaryDirectory() as d:
            Path(d, f"rank{rank}.bin").write_bytes(b"w" * 1000 * (rank + 1))
            train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
    deadline = time.monotonic() + DEADLINE_S
    while not os.path.exists(config["gate"]) and time.monotonic() < deadline:
        time.sleep(0.01)


def committed_bytes(run: Path) -> int:
    return sum(
        f.stat().st_size
        for d in run.iterdir()
        if d.name.startswith("checkpoint_0")
        for f in d.rglob("*")
        if f.is_file()
    )


def test_the_bytes_of_every_committed_checkpoint_are_counted_and_exported(
    tmp_path, monkeypatch, caplog
):
    port = free_port()
    monkeypatch.setenv("PHALANX_METRICS_PORT", str(port))
    caplog.set_level("INFO", logger="phalanx")
    gate = tmp_path / "gate"
    files = STEPS * (1000 + 2000)  # what the ranks wrote into the checkpoints
    seen: list[float] = []

    def scraper() -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            samples = scrape(port, "sized")  # a round counts once its checkpoint's bytes do
            if samples.get("phalanx_train_rounds_total", 0) >= STEPS:
                seen.append(samples["phalanx_train_checkpoint_bytes_written_total"])
                break
            time.sleep(0.02)
        gate.touch()

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        result = fit(sized_loop, tmp_path, "sized", workers=2, gate=str(gate))
    finally:
        gate.touch()
        thread.join(DEADLINE_S)
    goodput = result.goodput
    on_disk = committed_bytes(tmp_path / "runs" / "sized")
    assert goodput.bytes_written == on_disk >= files  # the ranks' files and phalanx's metadata
    assert seen == [on_disk]  # the counter, scraped while the run waited at its end
    assert goodput.summary().endswith(" of checkpoints written")
    assert any(r.getMessage().endswith(goodput.summary()) for r in caplog.records)
    record = json.loads((tmp_path / "runs" / "sized" / "run.json").read_text())
    assert record["goodput"]["bytes_written"] == on_disk
    assert Result.from_path(result.path).goodput == goodput
