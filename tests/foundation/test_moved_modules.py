"""Pickles that name a module by its old path still load.

A run directory written before the floors became folders: its ``trainer.pkl`` names
``phalanx._internal.execution_options``, which now lives in ``phalanx._foundation``. A checkpoint
or preprocessor pickled before the implementation modules gained their leading underscore: it
names ``phalanx.preprocess.scalers``, ``phalanx.torch.checkpoint`` and so on. Each old path is
checked both ways: the pickle loads with the alias, and without it the same bytes fail (so the
bytes do name the old path, and the alias is what makes them load).
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# Imported at collection, as the framework tests do (lightgbm sets KMP_* variables on import)
import phalanx.lightgbm
import phalanx.tensorflow
import phalanx.torch
import phalanx.xgboost
from phalanx._foundation import module_aliases
from phalanx._foundation.execution_options import ExecutionOptions
from phalanx.checkpoint import Checkpoint
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


def _scaler(_: Path) -> object:
    from phalanx.preprocess import StandardScaler

    return StandardScaler(columns=["x"])


def _fit_status(_: Path) -> object:
    from phalanx.preprocess import FitStatus

    return FitStatus.NOT_FITTED


def _concatenator(_: Path) -> object:
    from phalanx.preprocess import Concatenator

    return Concatenator(columns=["x", "y"])


def _encoder(_: Path) -> object:
    from phalanx.preprocess import OneHotEncoder

    return OneHotEncoder(columns=["x"])


def _imputer(_: Path) -> object:
    from phalanx.preprocess import SimpleImputer

    return SimpleImputer(columns=["x"])


def _mapper(_: Path) -> object:
    from phalanx.preprocess import BatchMapper

    return BatchMapper(len, batch_format="numpy")


def _checkpoint(cls: type[Checkpoint]) -> Callable[[Path], object]:
    return lambda path: cls.from_directory(str(path))


# old path -> (its module now, an object of it as a user or a run directory pickled it)
OLD_PATHS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "phalanx.preprocess.base": ("phalanx.preprocess._base", _fit_status),
    "phalanx.preprocess.scalers": ("phalanx.preprocess._scalers", _scaler),
    "phalanx.preprocess.concat": ("phalanx.preprocess._concat", _concatenator),
    "phalanx.preprocess.encoders": ("phalanx.preprocess._encoders", _encoder),
    "phalanx.preprocess.imputer": ("phalanx.preprocess._imputer", _imputer),
    "phalanx.preprocess.mapper": ("phalanx.preprocess._mapper", _mapper),
    "phalanx.torch.checkpoint": (
        "phalanx.torch._checkpoint",
        _checkpoint(phalanx.torch.TorchCheckpoint),
    ),
    "phalanx.xgboost.checkpoint": (
        "phalanx.xgboost._checkpoint",
        _checkpoint(phalanx.xgboost.XGBoostCheckpoint),
    ),
    "phalanx.lightgbm.checkpoint": (
        "phalanx.lightgbm._checkpoint",
        _checkpoint(phalanx.lightgbm.LightGBMCheckpoint),
    ),
    "phalanx.tensorflow.checkpoint": (
        "phalanx.tensorflow._checkpoint",
        _checkpoint(phalanx.tensorflow.TensorflowCheckpoint),
    ),
}


def _named_by(data: bytes, new: str, old: str) -> bytes:
    """``data`` (protocol 0) with every class of module ``new`` named by its ``old`` path."""
    new_global, old_global = f"c{new}\n".encode(), f"c{old}\n".encode()
    assert new_global in data
    return data.replace(new_global, old_global)


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_object_pickled_under_an_old_module_path_loads(
    old: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, make = OLD_PATHS[old]
    obj = make(tmp_path)
    assert type(obj).__module__ == new
    data = _named_by(pickle.dumps(obj, protocol=0), new, old)
    loaded = pickle.loads(data)
    assert type(loaded) is type(obj)
    assert pickle.dumps(loaded, protocol=0) == pickle.dumps(obj, protocol=0)

    monkeypatch.delitem(sys.modules, old)  # as if the alias were never kept
    with pytest.raises(ModuleNotFoundError, match=old.rpartition(".")[2]):
        pickle.loads(data)


def test_every_old_module_path_kept_has_a_pickle_test() -> None:
    importlib.import_module("phalanx.preprocess")  # the frameworks' packages are imported above
    kept = dict(module_aliases.KEPT_PATHS)
    assert kept, "no old module path is kept any more: drop OLD_PATHS and its test"
    assert not set(kept) - set(OLD_PATHS), "an old path kept with no case in OLD_PATHS"
    assert all(OLD_PATHS[old][0] == new for old, new in kept.items())


def test_without_the_moved_module_finder_the_old_trainer_pickle_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _old_pickle(DataConfig(execution_options=ExecutionOptions()))
    finders = [f for f in sys.meta_path if type(f).__name__ != "_MovedModuleFinder"]
    monkeypatch.setattr(sys, "meta_path", finders)
    monkeypatch.delitem(sys.modules, OLD, raising=False)
    with pytest.raises(ModuleNotFoundError, match="execution_options"):
        pickle.loads(data)
