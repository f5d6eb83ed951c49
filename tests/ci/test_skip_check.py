"""``.ci/run``'s skip check: a run that passed fails when a test was skipped for a reason not in
tests/_skips.py's allow-list; an allowed skip, a plain pass and a failure keep their exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = """
import pytest

def test_passes():
    pass

def test_allowed():
    pytest.skip("this machine has GPUs")

def test_unexpected():
    pytest.importorskip("no_such_package_phalanx")

@pytest.mark.skipif(True, reason="needs ray")
def test_marked():
    pass

def test_fails():
    assert {fail}
"""


def run_pytest(tmp_path: Path, *selection: str, strict: bool = True, fail: bool = False):
    (tmp_path / "test_cases.py").write_text(CASES.format(fail=not fail))
    flags = ["--fail-on-unexpected-skip"] if strict else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "_skips"]
        + flags
        + [f"test_cases.py::{name}" for name in selection],
        cwd=tmp_path,
        # Without the installed plugins (Ray's, ...): only the skip check is under test.
        env={**os.environ, "PYTHONPATH": TESTS, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unexpected_skip_fails_a_run_that_passed_and_is_named(tmp_path):
    done = run_pytest(tmp_path, "test_passes", "test_allowed", "test_unexpected", "test_marked")
    assert done.returncode == 1, done.stdout
    unexpected = done.stdout.split("unexpected skips", 1)[1]
    assert "test_cases.py::test_unexpected: " in unexpected
    assert "could not import 'no_such_package_phalanx'" in unexpected
    assert "test_cases.py::test_marked: Skipped: needs ray" in unexpected
    assert "test_allowed" not in unexpected
    assert "2 test(s) skipped for a reason not in tests/_skips.py" in unexpected


@pytest.mark.parametrize(
    ("selection", "fail", "code"),
    [
        (("test_passes", "test_allowed"), False, 0),  # an allowed skip is no failure
        (("test_passes", "test_fails"), True, 1),  # a failure stays a failure
    ],
)
def test_allowed_skips_and_failures_keep_their_exit_status(tmp_path, selection, fail, code):
    done = run_pytest(tmp_path, *selection, fail=fail)
    assert done.returncode == code, done.stdout
    assert ("unexpected skips" in done.stdout) == ("test_unexpected" in selection)


def test_without_the_flag_a_skip_is_only_reported(tmp_path):
    done = run_pytest(tmp_path, "test_passes", "test_unexpected", strict=False)
    assert done.returncode == 0, done.stdout
    assert "SKIPPED" in done.stdout and "unexpected skips" not in done.stdout
