"""A failing rank's traceback names the user's file, line and source line (real worker processes).

cloudpickle (3.1.3 on) rebuilds functions pickled by value with ``co_filename="<dynamic-code>"``;
the driver records the file names and the worker puts them back (``code_origins``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import traceback
from types import CodeType, ModuleType

import cloudpickle
import pytest

from phalanx import DataParallelTrainer, RunConfig, ScalingConfig, WorkerGroupError
from phalanx._internal.worker.code_origins import dump_function, load_function

USER_MODULE = textwrap.dedent(
    """\
    def helper(x):
        return 1 / x


    def train_func(config):
        scale = lambda v: helper(v) * 2  # noqa: E731
        scale(0)
    """
)


def _import_by_path(path) -> ModuleType:
    """A module imported from its file, as tools that load user scripts do: not in
    sys.modules, so cloudpickle copies its functions by value."""
    spec = importlib.util.spec_from_file_location("user_train_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_script_run_as_main_shows_its_file_and_source_line(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(
        USER_MODULE
        + textwrap.dedent(
            f"""
            if __name__ == "__main__":
                from phalanx import DataParallelTrainer, RunConfig, ScalingConfig
                DataParallelTrainer(
                    train_func,
                    scaling_config=ScalingConfig(num_workers=1),
                    run_config=RunConfig(storage_path={str(tmp_path)!r}, name="run"),
                ).fit()
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert f'File "{script}", line 7, in train_func' in proc.stderr
    assert "    scale(0)" in proc.stderr
    assert f'File "{script}", line 2, in helper' in proc.stderr
    assert "return 1 / x" in proc.stderr
    assert "<dynamic-code>" not in proc.stderr


def test_a_module_imported_by_path_shows_its_source_even_once_the_file_is_gone(tmp_path):
    path = tmp_path / "user_train_module.py"
    path.write_text(USER_MODULE)
    module = _import_by_path(path)
    trainer = DataParallelTrainer(
        module.train_func,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="run"),
    )
    # The worker cannot read the file (a notebook cell, a script on another machine): the
    # driver's copy of the source is shown.
    path.unlink()
    with pytest.raises(WorkerGroupError) as info:
        trainer.fit()
    text = str(info.value)
    assert f'File "{path}", line 6, in <lambda>' in text
    assert "scale = lambda v: helper(v) * 2" in text
    assert f'File "{path}", line 2, in helper' in text
    assert "return 1 / x" in text


def _strip_filenames(monkeypatch) -> None:
    """Pickle code as cloudpickle 3.1.3 does: the file name replaced by ``<dynamic-code>``."""
    table = cloudpickle.CloudPickler._dispatch_table
    original = table[CodeType]

    def reduce(code: CodeType):
        constructor, args = original(code)
        return constructor, tuple("<dynamic-code>" if a == code.co_filename else a for a in args)

    monkeypatch.setitem(table, CodeType, reduce)


def test_file_names_stripped_by_the_pickler_are_put_back(tmp_path, monkeypatch):
    path = tmp_path / "user_train_module.py"
    path.write_text(USER_MODULE)
    module = _import_by_path(path)
    _strip_filenames(monkeypatch)
    assert cloudpickle.loads(cloudpickle.dumps(module.train_func)).__code__.co_filename == (
        "<dynamic-code>"
    )

    fn = load_function(dump_function(module.train_func))

    assert fn is not module.train_func
    with pytest.raises(ZeroDivisionError) as info:
        fn({})
    frames = traceback.extract_tb(info.value.__traceback__)[1:]
    assert [(f.filename, f.lineno, f.name) for f in frames] == [
        (str(path), 7, "train_func"),
        (str(path), 6, "<lambda>"),
        (str(path), 2, "helper"),
    ]
    assert frames[1].line == "scale = lambda v: helper(v) * 2  # noqa: E731"
