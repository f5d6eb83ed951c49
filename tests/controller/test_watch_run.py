"""Watching a run: live worker output, the progress view and phalanx's lifecycle log lines.

Each test runs a real driver script in a subprocess (with pipes, or in a pseudo-terminal) whose
real workers wait on files the test creates only after it has seen what must arrive first.
"""

from __future__ import annotations

import logging
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import phalanx
from phalanx import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig

ERASE_LINE = "\r\x1b[2K"

DRIVER = r"""
import os, sys, tempfile, time
import phalanx
from phalanx import DataParallelTrainer, LoggingConfig, RunConfig, ScalingConfig

def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)

def tqdm_then_prompt(cfg):
    from tqdm import tqdm
    bar = tqdm(total=3, file=sys.stderr, mininterval=0)
    bar.update(1)
    wait_for(cfg["go"] + "-bar")  # the driver must show the update while the loop waits
    bar.update(2)
    bar.close()
    sys.stdout.write("continue? ")  # what input() writes: a prompt without a newline
    sys.stdout.flush()
    wait_for(cfg["go"] + "-prompt")
    print("yes")

def rounds(cfg):
    print("hello from the worker")
    for i in range(3):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "w"), "w").write(str(i))
            phalanx.report({"loss": 1.0 / (i + 1)},
                           checkpoint=phalanx.Checkpoint.from_directory(d))
        wait_for(cfg["go"] + f"-{i}")

class Printer(phalanx.Callback):
    def on_report(self, run_context, report):
        print(f"driver says round {report.training_iteration}")

if __name__ == "__main__":
    storage, verbose, fn, go, level = sys.argv[1:6]
    DataParallelTrainer(
        globals()[fn], train_loop_config={"go": go},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="watched", storage_path=storage, verbose=int(verbose),
                             logging_config=LoggingConfig(level) if level != "-" else None,
                             callbacks=[Printer()]),
    ).fit()
"""


class Driver:
    """The driver script in a subprocess; ``expect`` reads its output until a text appears."""

    def __init__(self, tmp_path: Path, fn: str, verbose: int, tty: bool, level: str = "-") -> None:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        self.go = str(tmp_path / "go")
        env = dict(os.environ, PHALANX_PROGRESS_INTERVAL_S="0.2", COLUMNS="200")
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        args = [sys.executable, str(script), str(tmp_path / "runs"), str(verbose), fn, self.go]
        if tty:
            master, slave = pty.openpty()
            self.proc = subprocess.Popen([*args, level], stdout=slave, stderr=slave, env=env)
            os.close(slave)
            self.fd = master
        else:
            self.proc = subprocess.Popen(
                [*args, level], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
            )
            assert self.proc.stdout is not None
            self.fd = self.proc.stdout.fileno()
        self.out = ""

    def expect(self, text: str, timeout_s: float = 60) -> str:
        """Everything read so far, once ``text`` is in it."""
        deadline = time.monotonic() + timeout_s
        while text not in self.out:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"{text!r} did not arrive")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready and not self._read() and text not in self.out:
                self._fail(f"{text!r} never came")
        return self.out

    def _fail(self, why: str) -> None:
        self.proc.kill()  # its workers end with it (they watch the driver)
        self.proc.wait()
        raise AssertionError(f"{why}; output so far:\n{self.out!r}")

    def _read(self) -> bool:
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # a pty reads EIO once the child is gone
            return False
        self.out += data.decode("utf-8", "replace")
        return bool(data)

    def release(self, suffix: str) -> None:
        Path(f"{self.go}-{suffix}").touch()

    def finish(self) -> str:
        self.proc.wait(timeout=60)
        while self._read():
            pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        else:
            os.close(self.fd)
        assert self.proc.returncode == 0, self.out
        return self.out


@pytest.mark.slow
def test_bar_updates_and_prompts_arrive_while_the_worker_waits(tmp_path: Path) -> None:
    driver = Driver(tmp_path, "tqdm_then_prompt", verbose=1, tty=False)
    out = driver.expect("1/3")  # the worker is blocked until the test has seen the bar
    assert "\r[rank0]: " in out and "[rank0]:  33%" in out
    driver.release("bar")
    out = driver.expect("[rank0]: continue? ")
    assert not out.split("[rank0]: continue? ", 1)[1].startswith("\n")  # no newline came yet
    driver.release("prompt")
    out = driver.finish()
    assert "3/3" in out and "continue? yes\n" in out
    log = (tmp_path / "runs" / "watched" / "logs").glob("**/rank_0.log")
    text = next(iter(log)).read_text()
    assert "1/3" in text and "3/3" in text and text.endswith("continue? yes\n")


@pytest.mark.slow
def test_progress_view_updates_on_a_terminal_without_garbling_output(tmp_path: Path) -> None:
    driver = Driver(tmp_path, "rounds", verbose=1, tty=True)
    driver.expect("watched · attempt 1 · 1/1 workers · round 1 · loss=1 · 1 checkpoint · ")
    driver.release("0")
    driver.expect("round 2 · loss=0.5 · 2 checkpoints")  # it updates while the run goes on
    driver.release("1")
    driver.expect("round 3 · loss=0.3333 · 3 checkpoints")
    driver.release("2")
    out = driver.finish()
    # The worker's line went above the status line (erased first), never into it.
    assert f"{ERASE_LINE}[rank0]: hello from the worker\r\n" in out
    assert f"{ERASE_LINE}driver says round 2\r\n" in out  # the driver's own prints too
    assert "Run 'watched' finished in" in out
    # The view is gone at the end: the last lines are the closing ones, no status line after.
    finished, goodput = out.rstrip().splitlines()[-2:]
    assert finished.endswith("checkpoint: checkpoint_000002"), out
    assert goodput.startswith("[phalanx] Run 'watched': goodput ") and " · " not in goodput, out


@pytest.mark.slow
def test_verbose_0_shows_no_view_and_no_lifecycle_lines(tmp_path: Path) -> None:
    driver = Driver(tmp_path, "rounds", verbose=0, tty=True)
    driver.expect("[rank0]: hello from the worker")
    for i in range(3):
        driver.release(str(i))
    out = driver.finish()
    assert "\x1b[2K" not in out and "attempt 1" not in out and "[phalanx]" not in out


@pytest.mark.slow
def test_without_a_terminal_progress_is_logged_in_plain_lines(tmp_path: Path) -> None:
    driver = Driver(tmp_path, "rounds", verbose=1, tty=False, level="DEBUG")
    out = driver.expect("[phalanx] watched · attempt 1 · 1/1 workers · round 1 · loss=1")
    assert f"[phalanx] Run 'watched' started: engine local, 1 worker, storage {tmp_path}" in out
    assert "[phalanx] Checkpoint checkpoint_000000 committed (round 1)" in out  # DEBUG
    for i in range(3):
        driver.release(str(i))
    out = driver.finish()
    assert "\x1b[" not in out
    assert "[phalanx] Run 'watched' finished in 0:00:" in out


def _train_with_checkpoints(config: dict) -> None:
    import tempfile

    for i in range(2):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "w").write_text(str(i))
            phalanx.report({"loss": float(i)}, checkpoint=Checkpoint.from_directory(d))
    if config.get("fail") and phalanx.get_context().get_attempt() == 0:
        raise RuntimeError("boom")


def test_lifecycle_lines_go_through_the_phalanx_logger(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="phalanx")

    def fit(**config: object) -> None:
        DataParallelTrainer(
            _train_with_checkpoints,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(
                name="logged",
                storage_path=str(tmp_path),
                failure_config=phalanx.FailureConfig(max_failures=1),
                checkpoint_config=CheckpointConfig(
                    checkpoint_score_attribute="loss", checkpoint_score_order="min"
                ),
            ),
        ).fit()

    fit()
    text = caplog.text
    run_path = tmp_path / "logged"
    assert f"Run 'logged' started: engine inline, 1 worker, storage {run_path}" in text
    assert "Checkpoint checkpoint_000001 committed (round 2)" in text
    # The best by loss (the first), not the latest.
    assert "Run 'logged' finished in 0:00:00; best checkpoint: checkpoint_000000" in text
    caplog.clear()
    fit(fail=True)
    assert "Resuming run 'logged' from checkpoint_000001" in caplog.text
    assert "Attempt 1 failed" in caplog.text and "RuntimeError: boom" in caplog.text
    assert "Run 'logged' finished in" in caplog.text


def test_rank_prefixes_go_at_line_starts_and_after_carriage_returns() -> None:
    from phalanx._foundation.terminal import LineState

    state = LineState("[rank1]: ")
    pieces = ["epoch 1", " done\nbar  0%", "\r bar 50%", "\r bar 100%\r\n", "\nlast"]
    out = "".join(state.render(p) for p in pieces)
    assert out == (
        "[rank1]: epoch 1 done\n[rank1]: bar  0%\r[rank1]:  bar 50%\r[rank1]:  bar 100%\r\n"
        "[rank1]:\n[rank1]: last"
    )
    assert state.open


def test_a_partial_line_never_splits_a_character() -> None:
    from phalanx._internal.engines.ray.output import _utf8_boundary

    bar = "50%|██".encode()
    assert _utf8_boundary(bar) == len(bar)
    for cut in (1, 2):  # "█" is 3 bytes: half of it waits for the rest
        assert _utf8_boundary(bar[:-cut]) == len(bar) - 3
    assert _utf8_boundary(b"plain") == 5
