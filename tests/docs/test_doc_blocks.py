"""Every ```python block of the documentation (README.md and every page under docs/) runs as
written, as a reader would run it: alone, as a script, in a fresh HOME (so its runs go to this
test's ``~/phalanx_results``), from a directory holding a copy of ``examples/``. The ```bash
blocks run in tests/cli/test_readme_commands.py, after the quick start's demo.

A block that cannot run here is preceded by ``<!-- not run: <reason> -->``; the reason is
required (tests/_helpers/doc_blocks.py finds the blocks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from _helpers.doc_blocks import ROOT, blocks

pytestmark = pytest.mark.slow

PYTHON = blocks("python")
RUN = [block for block in PYTHON if block.not_run is None]


def test_every_block_kept_from_running_says_why():
    for block in blocks("python") + blocks("bash"):
        assert block.not_run != "", f"{block.id}: `<!-- not run: -->` needs its reason"
    assert len(RUN) >= 10, "the pages' Python blocks are found"


@pytest.mark.parametrize("block", RUN, ids=[block.id for block in RUN])
def test_python_block_runs(block, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    script = work / "doc_block.py"
    script.write_text(block.code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    env.update(HOME=str(home), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{block.id} failed (exit {done.returncode}):\n{block.code}\n--- output\n"
        f"{done.stdout}{done.stderr}"
    )
