"""A run directory written before the floors became folders still loads: its ``trainer.pkl``
names ``phalanx._internal.execution_options``, which now lives in ``phalanx._foundation``."""

from __future__ import annotations

import pickle
import subprocess
import sys

import phalanx
from phalanx._foundation.execution_options import ExecutionOptions
from phalanx.config import DataConfig

OLD = "phalanx._internal.execution_options"
NEW = "phalanx._foundation.execution_options"


def _old_pickle(obj: object) -> bytes:
    """``obj`` pickled as a phalanx from before the move wrote it (protocol 0 names each class
    by its module path as text)."""
    data = pickle.dumps(obj, protocol=0)
    assert NEW.encode() in data
    return data.replace(NEW.encode(), OLD.encode())


def test_a_data_config_pickled_under_the_old_module_path_loads() -> None:
    # phalanx's own ExecutionOptions (default_ingest_options() returns Ray Data's once Ray Data
    # is imported, and an old trainer.pkl written without Ray Data holds this one)
    options = ExecutionOptions(preserve_order=True)
    config = DataConfig(datasets_to_split=["train"], execution_options=options)
    loaded = pickle.loads(_old_pickle(config))
    assert type(loaded.execution_options).__module__ == NEW
    assert loaded.execution_options.preserve_order is True
    assert phalanx.__version__


def test_the_old_path_is_imported_only_when_asked_for() -> None:
    code = (
        "import sys, phalanx\n"
        f"assert {OLD!r} not in sys.modules\n"
        f"import {OLD} as old, {NEW} as new\n"
        "assert old is new\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
