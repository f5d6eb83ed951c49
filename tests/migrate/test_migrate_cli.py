"""``phalanx migrate`` as a user runs it: diff, --write, --check, directories, exit status."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from phalanx.cli import main

RAY_SCRIPT = textwrap.dedent(
    """\
    import ray
    from ray import train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer


    def train_func(config):
        train.report({"loss": 1.0})  # every rank reports


    ray.init()
    TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit()
    """
)

PHALANX_SCRIPT = textwrap.dedent(
    """\
    import phalanx as train
    from phalanx import ScalingConfig
    from phalanx.torch import TorchTrainer


    def train_func(config):
        train.report({"loss": 1.0})  # every rank reports


    TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit()
    """
)

TUNE_SCRIPT = textwrap.dedent(
    """\
    from ray import tune
    from ray.train.torch import TorchTrainer

    analysis = tune.run(TorchTrainer(f))
    """
)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_prints_a_diff_and_changes_nothing(tmp_path, capsys) -> None:
    script = _write(tmp_path / "train.py", RAY_SCRIPT)
    assert main(["migrate", str(script)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"--- {script}\n+++ {script}\n")
    assert "\n-from ray.train.torch import TorchTrainer\n" in out
    assert "\n+from phalanx.torch import TorchTrainer\n" in out
    assert "\n-ray.init()\n" in out
    assert f"{script}:11: removed ray.init()" in err
    assert "1 file(s): 1 would change, 0 item(s) need your attention" in err
    assert script.read_text() == RAY_SCRIPT


def test_write_then_check_is_clean(tmp_path, capsys) -> None:
    script = _write(tmp_path / "train.py", RAY_SCRIPT)
    assert main(["migrate", "--check", str(script)]) == 1
    assert main(["migrate", "--write", str(script)]) == 0
    assert script.read_text() == PHALANX_SCRIPT
    capsys.readouterr()
    assert main(["migrate", "--check", str(script)]) == 0  # idempotent: nothing left to do
    assert main(["migrate", "--write", str(script)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "0 would change" in err
    assert script.read_text() == PHALANX_SCRIPT


def test_what_has_no_equivalent_is_listed_and_exits_2(tmp_path, capsys) -> None:
    script = _write(tmp_path / "tune_it.py", TUNE_SCRIPT)
    assert main(["migrate", "--check", str(script)]) == 2  # 2 wins over 1
    assert main(["migrate", "--write", str(script)]) == 2
    _, err = capsys.readouterr()
    assert "needs your attention (left as it was):" in err
    assert f"{script}:4: ray.tune.run -> ray.tune.run: phalanx.tune has no run" in err
    assert script.read_text() == TUNE_SCRIPT.replace("ray.train.torch", "phalanx.torch")


def test_directories_are_walked(tmp_path, capsys) -> None:
    a = _write(tmp_path / "proj" / "a.py", RAY_SCRIPT)
    b = _write(tmp_path / "proj" / "pkg" / "b.py", RAY_SCRIPT)
    plain = _write(tmp_path / "proj" / "pkg" / "plain.py", "import os\n")
    hidden = _write(tmp_path / "proj" / ".venv" / "lib" / "c.py", RAY_SCRIPT)
    notes = _write(tmp_path / "proj" / "notes.txt", RAY_SCRIPT)
    assert main(["migrate", "--write", str(tmp_path / "proj")]) == 0
    _, err = capsys.readouterr()
    assert "3 file(s): 2 migrated" in err
    assert a.read_text() == b.read_text() == PHALANX_SCRIPT
    assert plain.read_text() == "import os\n"
    assert hidden.read_text() == notes.read_text() == RAY_SCRIPT


def test_a_file_that_does_not_parse_is_named_and_the_rest_migrated(tmp_path, capsys) -> None:
    bad = _write(tmp_path / "bad.py", "def broken(:\n")
    good = _write(tmp_path / "good.py", RAY_SCRIPT)
    assert main(["migrate", "--write", str(tmp_path)]) == 2
    _, err = capsys.readouterr()
    assert f"{bad}: could not migrate" in err
    assert good.read_text() == PHALANX_SCRIPT
    assert bad.read_text() == "def broken(:\n"


def test_a_missing_path_is_an_error(tmp_path, capsys) -> None:
    assert main(["migrate", str(tmp_path / "nope.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_line_endings_are_kept(tmp_path) -> None:
    script = tmp_path / "crlf.py"
    script.write_bytes(RAY_SCRIPT.replace("\n", "\r\n").encode())
    assert main(["migrate", "--write", str(script)]) == 0
    assert script.read_bytes() == PHALANX_SCRIPT.replace("\n", "\r\n").encode()


def test_the_module_entry_point_runs_it_and_documents_exit_codes(tmp_path) -> None:
    script = _write(tmp_path / "train.py", RAY_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "migrate", "--check", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "+from phalanx.torch import TorchTrainer" in proc.stdout
    help_text = subprocess.run(
        [sys.executable, "-m", "phalanx", "migrate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "exit status:" in help_text and "--check: some file would change" in help_text


@pytest.mark.parametrize("blocked", ["libcst"])
def test_without_libcst_it_names_the_extra(tmp_path, blocked: str) -> None:
    script = _write(tmp_path / "train.py", RAY_SCRIPT)
    # None in sys.modules makes `import libcst` fail as if it were not installed.
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from phalanx.cli import main\n"
        f"sys.exit(main(['migrate', {str(script)!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert 'pip install "phalanx[migrate]"' in proc.stderr
    assert script.read_text() == RAY_SCRIPT
