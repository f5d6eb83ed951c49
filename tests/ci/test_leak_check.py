"""The leak check every test runs (tests/_leaks.py) and the session's temp HOME: a test that
writes a run to ~/phalanx_results or a ``phalanx*`` entry to the temp directory fails, and a
leaked environment variable is put back before the test fails, so the next test starts clean."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest
from _leaks import CHECK_SHARED_DIRS, REAL_HOME
from _leaks import no_leaks as check_no_leaks

from phalanx import DataParallelTrainer, ScalingConfig


def test_home_and_the_default_storage_path_are_the_sessions_temp_dir(isolated_home):
    assert os.path.expanduser("~") == isolated_home != REAL_HOME
    assert "PHALANX_STORAGE_PATH" not in os.environ
    outside = r"wrote outside its temp directory(.|\n)*HINT:"
    with pytest.raises(AssertionError, match=outside), check_no_leaks():
        result = DataParallelTrainer(
            lambda: None, scaling_config=ScalingConfig(num_workers=1, engine="thread")
        ).fit()  # no storage_path: the default, ~/phalanx_results
    assert result.path.startswith(os.path.join(isolated_home, "phalanx_results"))
    shutil.rmtree(result.path)


def test_a_leaked_env_var_is_restored_before_the_test_fails():
    name = f"PHALANX_LEAK_{uuid.uuid4().hex[:6]}"
    changed = f"changed environment variables: \\['{name}'\\]"
    with pytest.raises(AssertionError, match=changed), check_no_leaks():
        os.environ[name] = "1"
    assert name not in os.environ


@pytest.mark.skipif(not CHECK_SHARED_DIRS, reason="shared temp dir checked only alone (.ci/run)")
def test_a_phalanx_temp_entry_is_a_leak_unless_it_is_a_users_checkpoint():
    with pytest.raises(AssertionError, match="wrote outside its temp directory"), check_no_leaks():
        leaked = tempfile.mkdtemp(prefix="phalanx_logs_")
    os.rmdir(leaked)
    with check_no_leaks():  # Checkpoint.from_model's directory: the user's, as in Ray
        users = tempfile.mkdtemp(prefix="phalanx_torch_checkpoint_")
    os.rmdir(users)
