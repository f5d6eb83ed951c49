"""Every shell command of the documentation (README.md and every page under docs/) runs as
written after the quick start's demo, as a new user would run them: in a fresh HOME (so
``~/phalanx_results`` is this test's), from a directory holding a copy of ``examples/``, through
the installed ``phalanx`` script and bash.

The rule for ```bash blocks (tests/_helpers/doc_blocks.py finds them, README.md first, then the
pages in path order): README.md's first is the set-up (install, then ``python examples/demo.py``,
which this test runs; and the whole suite); every other one runs, line by line, unless an HTML
comment ``<!-- not run: why -->`` stands just before it. Comment lines are skipped, and so are
``pip install`` lines (the environment is installed). ``my_project/``, the reader's own code in
the docs, is a small Ray Train script here. A ``phalanx serve`` line starts the server in the
background and waits until it answers ``/readyz``; later ``curl`` lines query it; it is stopped
with SIGINT (as Ctrl-C would) when another server takes its port or the block ends, and must exit
0 saying so. Ports are mapped to free ones, so the test runs beside anything on port 8000.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _helpers import free_port, wait_until
from _helpers.doc_blocks import ROOT, blocks

RAY_TRAIN_SCRIPT = """\
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
"""

pytestmark = pytest.mark.slow


def doc_blocks() -> list[tuple[str, str | None, list[str]]]:
    """(where, why it is not run or None, its commands) for each ```bash block, in order."""
    found = []
    for block in blocks("bash"):
        lines = [line.strip() for line in block.code.splitlines()]
        commands = [ln for ln in lines if ln and not ln.startswith("#")]
        found.append((block.id, block.not_run, commands))
    return found


@dataclass
class Shell:
    """Runs README lines in ``cwd`` with ``env``; keeps the servers it started, by README port."""

    cwd: Path
    env: dict[str, str]
    ports: dict[int, int] = field(default_factory=dict)
    servers: dict[int, tuple[subprocess.Popen, Path, str]] = field(default_factory=dict)

    def port(self, readme_port: int) -> int:
        return self.ports.setdefault(readme_port, free_port())

    def run(self, line: str, where: str = "") -> str:
        if line.startswith("pip install "):
            return ""
        if line.startswith("phalanx serve "):
            return self.serve(line)
        if line.startswith("curl "):
            line = re.sub(r"localhost:(\d+)", lambda m: f"localhost:{self.port(int(m[1]))}", line)
        done = subprocess.run(
            ["bash", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        said = f"{where}: {line}"
        assert done.returncode == 0, f"{said}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
        assert (done.stdout + done.stderr).strip(), f"{said} printed nothing"
        return done.stdout

    def serve(self, line: str) -> str:
        found = re.search(r"--port (\d+)", line)
        readme_port = int(found[1]) if found else 8000
        self.stop(readme_port)
        port = self.port(readme_port)
        command = re.sub(r"--port \d+|\s+#.*$", "", line) + f" --port {port}"
        log = self.cwd / f"serve_{len(self.servers)}_{readme_port}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.servers[readme_port] = (process, log, line)

        def serving() -> bool:
            assert process.poll() is None, f"{line}\nexited:\n{log.read_text()}"
            return f"Serving on http://127.0.0.1:{port}" in log.read_text()

        wait_until(serving, 60, f"{line} to load its model")
        ready = subprocess.run(
            ["curl", "-sf", f"localhost:{port}/readyz"], capture_output=True, text=True, timeout=60
        )
        assert ready.returncode == 0, f"{line}: /readyz failed once serving\n{log.read_text()}"
        return log.read_text()

    def stop(self, readme_port: int) -> None:
        if readme_port not in self.servers:
            return
        process, log, line = self.servers.pop(readme_port)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        assert process.wait(60) == 0, f"{line}\n{log.read_text()}"
        text = log.read_text()
        assert text.count("Serving best checkpoint") <= 1, text
        assert "SIGINT: stopping" in text and "Stopped." in text, text

    def stop_all(self) -> None:
        for readme_port in list(self.servers):
            self.stop(readme_port)

    def kill_all(self) -> None:
        for process, _, _ in self.servers.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_every_readme_command_runs_as_written_after_the_demo(tmp_path):
    setup, *rest = doc_blocks()
    assert setup[0].startswith("README.md:") and "python examples/demo.py" in setup[2][0], setup
    assert all(why != "" for _, why, _ in rest), "`<!-- not run: -->` needs its reason"
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    shutil.copytree(ROOT / "examples", cwd / "examples")
    (cwd / "my_project").mkdir()
    (cwd / "my_project" / "train.py").write_text(RAY_TRAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    env.update(HOME=str(home), COLUMNS="200")
    shell = Shell(cwd, env)
    shell.run("python examples/demo.py")
    assert (home / "phalanx_results" / "demo" / "run.json").exists()
    outputs = {}
    try:
        for where, why, commands in rest:
            if why:
                continue
            for line in commands:
                outputs[line] = shell.run(line, where)
            shell.stop_all()
    finally:
        shell.kill_all()
    predicted = [out for line, out in outputs.items() if "/predict" in line]
    assert predicted and all('"predictions"' in out for out in predicted), predicted
    assert (cwd / "curves.png").stat().st_size > 0
    assert "demo-lr" in next(out for line, out in outputs.items() if line.startswith("phalanx ls"))


def test_serve_xgboost_writes_where_it_says_and_its_shell_lines_run(tmp_path):
    script = ROOT / "examples" / "serve_xgboost.py"
    said = re.findall(r"^ {4}((?:phalanx|curl) .*)$", script.read_text().split('"""')[1], re.M)
    assert [line.split()[0] for line in said] == ["phalanx", "curl"], said
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    env.update(HOME=str(home), COLUMNS="200")
    shell = Shell(cwd, env)
    assert "served:" in shell.run(f"python {script}")
    assert (home / "phalanx_results" / "serve_xgboost" / "run.json").exists()
    try:
        outputs = [shell.run(line) for line in said]
        shell.stop_all()
    finally:
        shell.kill_all()
    (probability,) = json.loads(outputs[1])["predictions"]  # of class 1, for the one row
    assert 0 < probability < 1
