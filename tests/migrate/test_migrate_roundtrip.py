"""Round trips: Ray's own doc examples, in Ray's original form (``ray_examples/``), migrated by
``python -m phalanx migrate --write`` and then run unchanged as scripts, with Ray blocked from
importing (``sys.modules["ray"] = None``): the migrated code needs nothing of Ray.

Each example is a Ray 2.60 (or AIR-era) doc example with synthetic data of the same shape, 2
workers and a few steps (its header names the doc page); it asserts its own results and prints
``ROUNDTRIP-OK``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parent / "ray_examples"
SCRIPTS = sorted(path.name for path in EXAMPLES.glob("*.py"))

# Runs a script as `python script.py` would, with `import ray` failing.
_RUN_WITHOUT_RAY = (
    "import runpy, sys\n"
    "sys.modules['ray'] = None\n"
    "sys.argv = [sys.argv[1]]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "assert sys.modules.get('ray') is None, 'the migrated script imported Ray'\n"
)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "phalanx", "migrate", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    """A copy of ray_examples/ after `phalanx migrate --write` on its directory."""
    root = tmp_path_factory.mktemp("roundtrip")
    shutil.copytree(EXAMPLES, root / "examples")
    wrote = _cli("--write", "examples", cwd=root)
    assert wrote.returncode == 0, wrote.stderr
    assert f"{len(SCRIPTS)} file(s): {len(SCRIPTS)} migrated, 0 item(s)" in wrote.stderr
    again = _cli("--check", "examples", cwd=root)
    assert again.returncode == 0, again.stdout + again.stderr  # idempotent
    return root


def test_there_are_enough_examples() -> None:
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("script", SCRIPTS)
def test_migrated_ray_example_runs_without_ray(migrated: Path, script: str) -> None:
    path = migrated / "examples" / script
    code = path.read_text()
    assert not re.search(r"^\s*(import|from)\s+ray\b", code, re.MULTILINE), code
    home = migrated / f"home-{path.stem}"
    (home / "tmp").mkdir(parents=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "PHALANX_STORAGE_PATH": str(home / "storage"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_RAY, str(path)],
        capture_output=True,
        text=True,
        cwd=home,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "ROUNDTRIP-OK" in proc.stdout
    assert (home / "storage").is_dir()  # the runs went where the user's default points
