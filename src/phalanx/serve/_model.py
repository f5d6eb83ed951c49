"""The served model: a checkpoint (or a run's best/latest one) loaded with its Predictor.

``ModelSpec`` is the blueprint (picklable: it travels to worker processes and Ray Serve
replicas); ``ServedModel`` is the loaded predictor. Prediction goes through
``Predictor.predict`` with the checkpoint's preprocessor, exactly as ``BatchPredictor``'s scoring
workers call it, so online and batch predictions are the same numbers.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from phalanx.checkpoint import Checkpoint
from phalanx.errors import ConfigError
from phalanx.predict import Predictor, checkpoint_framework
from phalanx.serve._columns import input_columns, model_columns

# What serve() takes as the model: a Checkpoint, a checkpoint directory or a run directory.
CheckpointSource = Checkpoint | str | os.PathLike[str]
# A Predictor class, a framework name ("torch"), "module:Class", or None (the checkpoint's).
PredictorChoice = type[Predictor] | str | None

__all__ = ["ModelSpec", "ServedModel", "resolve_checkpoint"]

logger = logging.getLogger(__name__)

PREDICTORS = {
    "torch": "phalanx.torch:TorchPredictor",
    "xgboost": "phalanx.xgboost:XGBoostPredictor",
    "lightgbm": "phalanx.lightgbm:LightGBMPredictor",
    "sklearn": "phalanx.sklearn:SklearnPredictor",
}
CHOICES = ("best", "latest")


@dataclass(frozen=True)
class ModelSpec:
    """What to serve. ``checkpoint``: a Checkpoint, a checkpoint directory, or a run directory
    (``result.path``: its ``best`` checkpoint by the run's own CheckpointConfig, or ``latest``,
    or a checkpoint directory's name, per ``choice``). ``predictor``: a Predictor class,
    ``"torch"``/``"xgboost"``/``"lightgbm"`` or ``"module:Class"``; None reads the framework from
    the checkpoint. ``predictor_kwargs`` go to ``from_checkpoint`` (e.g. ``model=Net()``),
    ``predict_kwargs`` to every ``predict`` call. ``columns``: the input columns a request must
    have (checked before batching; None: taken from the model where it names them).

    Example::

        spec = ModelSpec(result.path, "torch", predictor_kwargs={"model": Net()}, choice="latest")
    """

    checkpoint: CheckpointSource
    predictor: PredictorChoice = None
    predictor_kwargs: dict[str, object] = field(default_factory=dict)
    predict_kwargs: dict[str, Any] = field(default_factory=dict)  # the user's, for predict()
    columns: tuple[str, ...] | None = None
    choice: str = "best"
    cli: bool = False  # errors name command-line options (--model), not keyword arguments

    def check(self) -> Checkpoint:
        """The checkpoint to serve; raise now (ConfigError) if it or the predictor class cannot
        be found."""
        checkpoint = resolve_checkpoint(self.checkpoint, self.choice)
        predictor_class(self.predictor, checkpoint, self.cli)
        source = self.checkpoint
        if not isinstance(source, Checkpoint) and Checkpoint(os.fspath(source)) != checkpoint:
            run = os.fspath(source)
            logger.info("Serving %s checkpoint %s of run %s", self.choice, checkpoint.path, run)
        return checkpoint

    def load(self) -> ServedModel:
        """The loaded model; a ConfigError saying why and what to change if it cannot be."""
        checkpoint = resolve_checkpoint(self.checkpoint, self.choice)
        cls = predictor_class(self.predictor, checkpoint, self.cli)
        try:
            predictor = cls.from_checkpoint(checkpoint, **self.predictor_kwargs)
        except Exception as exc:
            raise ConfigError(explain_load_failure(exc, cls, checkpoint, self)) from exc
        return ServedModel(predictor, checkpoint, self)


class ServedModel:
    """A loaded predictor that turns request DataFrames into prediction DataFrames."""

    def __init__(self, predictor: Predictor, checkpoint: Checkpoint, spec: ModelSpec) -> None:
        self.predictor = predictor
        self.checkpoint = checkpoint
        self.predict_kwargs = _default_predict_kwargs(predictor, spec.predict_kwargs)
        self.columns = list(spec.columns) if spec.columns else model_columns(predictor)
        self.input_columns = self.columns or input_columns(predictor)
        self.framework = checkpoint_framework(checkpoint)

    def predict(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """Predictions for ``frame``'s rows, in order, one array per output column: the rows go
        to ``Predictor.predict`` in the predictor's own batch format, as BatchPredictor's
        scoring workers hand them (a numpy predictor skips pandas, whose fixed cost per call
        outweighs the model's on the small batches a server sees)."""
        batch: pd.DataFrame | dict[str, np.ndarray] = frame
        if self.predictor.batch_format == "numpy":
            batch = {str(c): _column(frame[c]) for c in frame.columns}
        out = self.predictor.predict(batch, **self.predict_kwargs)
        columns = {
            str(c): _column(out[c]) for c in (out.columns if hasattr(out, "columns") else out)
        }
        lengths = {len(v) for v in columns.values()}
        if lengths != {len(frame)}:
            raise RuntimeError(
                f"The predictor returned {sorted(lengths)} rows for {len(frame)} input rows.\n"
                "HINT: a served predictor must return one prediction per row."
            )
        return columns

    def predict_many(self, frames: list[pd.DataFrame]) -> list[dict[str, np.ndarray]]:
        """One model call for several requests' rows; each gets its own slice back."""
        if len(frames) == 1:
            return [self.predict(frames[0])]
        out = self.predict(pd.concat(frames, ignore_index=True))
        bounds = np.cumsum([0] + [len(f) for f in frames])
        return [{c: v[a:b] for c, v in out.items()} for a, b in itertools.pairwise(bounds)]

    def metadata(self) -> dict[str, object]:
        from phalanx._version import __version__

        preprocessor = self.predictor.get_preprocessor()
        return {
            "framework": self.framework,
            "predictor": type(self.predictor).__name__,
            "checkpoint": self.checkpoint.path,
            "feature_columns": self.columns,  # required in every request
            "input_columns": self.input_columns,  # what the model and preprocessor read
            "preprocessor": None if preprocessor is None else type(preprocessor).__name__,
            "phalanx_version": __version__,
            "pid": os.getpid(),  # which server process answered (with --workers N)
        }


def resolve_checkpoint(source: object, choice: str = "best") -> Checkpoint:
    """``source`` as a Checkpoint: itself, a checkpoint directory, or one of a run directory's
    checkpoints (``choice``: ``"best"``, ``"latest"`` or a checkpoint directory's name)."""
    if isinstance(source, Checkpoint):
        return source
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(
            f"Cannot serve {source!r}: it is a {type(source).__name__}.\nHINT: pass a "
            "Checkpoint, a checkpoint directory or a run directory (result.path)."
        )
    from phalanx.cli._runs import RUN_FILES, CLIError, open_run

    checkpoint = Checkpoint(os.fspath(source))
    names = _listing(checkpoint)
    if not names & set(RUN_FILES):
        return checkpoint
    try:
        run = open_run(os.fspath(source))
    except CLIError as exc:
        raise ConfigError(str(exc)) from exc
    ranked = [c for c, _ in run.manager.best_checkpoints()]
    picked = _pick(ranked, run.manager.latest_checkpoint, choice)
    if picked is None:
        raise ConfigError(
            f"The run {os.fspath(source)!r} has no checkpoint called {choice!r} (it kept "
            f"{[_name(c) for c in ranked]}).\nHINT: select 'best', 'latest' or one of those "
            "names (--checkpoint on the command line); a run keeps checkpoints only when "
            "report() is given one."
        )
    return picked


def _pick(ranked: list[Checkpoint], latest: Checkpoint | None, choice: str) -> Checkpoint | None:
    if choice == "best":
        return ranked[-1] if ranked else None
    if choice == "latest":
        return latest
    return next((c for c in ranked if _name(c) == choice), None)


def _name(checkpoint: Checkpoint) -> str:
    return str(checkpoint.path).rstrip("/").rsplit("/", 1)[-1]


def _listing(checkpoint: Checkpoint) -> set[str]:
    fs = checkpoint.filesystem
    if not fs.isdir(checkpoint.path):
        raise ConfigError(
            f"Cannot serve {checkpoint.path!r}: there is no such directory.\nHINT: pass a "
            "checkpoint directory (result.checkpoint.path) or a run directory (result.path)."
        )
    return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(checkpoint.path, detail=False)}


def predictor_class(
    predictor: object, checkpoint: Checkpoint, cli: bool = False
) -> type[Predictor]:
    """The Predictor class: given, named (framework or ``module:Class``), or the checkpoint's.
    ``cli``: errors name ``--predictor`` rather than ``predictor=``."""
    if isinstance(predictor, type) and issubclass(predictor, Predictor):
        return predictor
    if predictor is None:
        predictor = checkpoint_framework(checkpoint)
        if predictor is None:
            names = (
                f"--predictor {', '.join(PREDICTORS)} or my_module:MyPredictor"
                if cli
                else f"predictor={', '.join(map(repr, PREDICTORS))} or 'my_module:MyPredictor'"
            )
            raise ConfigError(
                f"Cannot tell which framework trained {checkpoint.path!r}: its metadata names "
                f"none and it holds no model.pt, model.ubj/json or model.txt.\nHINT: pass {names}."
            )
    if not isinstance(predictor, str):
        raise ConfigError(
            f"predictor={predictor!r} is not a Predictor class or a name.\nHINT: pass e.g. "
            "TorchPredictor, 'torch' or 'my_module:MyPredictor'."
        )
    what = "--predictor" if cli else "predictor"
    found = import_object(PREDICTORS.get(predictor, predictor), what)
    if not (isinstance(found, type) and issubclass(found, Predictor)):
        raise ConfigError(
            f"{setting(what, predictor)} names {found!r}, which is not a Predictor subclass.\n"
            "HINT: subclass phalanx.predict.Predictor and implement from_checkpoint."
        )
    return found


def import_object(path: str, what: str) -> Any:  # whatever the user's module holds there
    """``"package.module:attr"`` imported; a ConfigError naming ``what`` (a keyword argument, or
    an option such as ``--model``) if it cannot be."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"{setting(what, path)} is not a known name or 'module:attribute'.\nHINT: use e.g. "
            f"torch, xgboost, lightgbm or my_package.models:Thing."
        )
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{setting(what, path)} cannot be imported: {type(exc).__name__}: {exc}.\nHINT: "
            "check the spelling, and that the module is on PYTHONPATH (run from its directory)."
        ) from exc


def setting(what: str, value: str) -> str:
    """How the user wrote it: ``--model m:f`` on the command line, ``model='m:f'`` in Python."""
    return f"{what} {value}" if what.startswith("--") else f"{what}={value!r}"


def explain_load_failure(
    exc: Exception, cls: type[Predictor], checkpoint: Checkpoint, spec: ModelSpec
) -> str:
    """Why ``cls.from_checkpoint`` failed on ``checkpoint``, and what to change, in the caller's
    terms (``--model`` on the command line, ``model=`` in Python)."""
    model = "--model my_module:make_model" if spec.cli else "model=MyModel()"
    own = "--predictor my_module:MyPredictor" if spec.cli else "predictor=MyPredictor"
    where = f"Could not load the model of {checkpoint.path!r} with {cls.__name__}"
    torch = _is_torch(cls)
    if torch and "model.pt" not in _listing(checkpoint):
        files = ", ".join(sorted(_listing(checkpoint))) or "nothing"
        return (
            f"{where}: the checkpoint holds {files}, not model.pt (what it loads).\nHINT: save "
            "the weights in the training function (TorchCheckpoint.from_state_dict("
            "model.state_dict()), or torch.save of the state dict to model.pt in the checkpoint "
            f"directory) and serve with {model}; or load this checkpoint your own way with {own}."
        )
    if torch and isinstance(exc, ValueError) and "model" not in spec.predictor_kwargs:
        tail = " (a function or nn.Module class, importable from where you run)" if spec.cli else ""
        return (
            f"{where}: its model.pt holds a state dict, the weights without the module.\nHINT: "
            f"name the module to load them into: {model}{tail}."
        )
    said = str(exc).split("\nHINT:")[0].strip()
    what = f"{where}: {type(exc).__name__}: {said}"
    if "HINT:" in str(exc):
        return f"{what}\nHINT:{str(exc).split('HINT:', 1)[1]}"
    return (
        f"{what}\nHINT: check that the checkpoint holds what {cls.__name__} loads (and for torch, "
        f"that {model} builds the architecture it was trained with), or load it your own way "
        f"with {own}."
    )


def _is_torch(cls: type[Predictor]) -> bool:
    # By name: importing phalanx.torch to compare classes would import torch to serve xgboost.
    return any(
        c.__name__ == "TorchPredictor" and c.__module__.startswith("phalanx.torch")
        for c in cls.__mro__
    )


def _default_predict_kwargs(predictor: Predictor, given: dict[str, Any]) -> dict[str, Any]:
    """JSON numbers arrive as float64; a float32 torch model would reject them, so torch
    inputs get the model's floating dtype unless ``predict_kwargs`` names a ``dtype``."""
    kwargs = dict(given)
    parameters = getattr(getattr(predictor, "model", None), "parameters", None)
    if "dtype" in kwargs or parameters is None:
        return kwargs
    for parameter in parameters():
        if parameter.is_floating_point():
            kwargs["dtype"] = parameter.dtype
            break
    return kwargs


def _column(values: object) -> np.ndarray:
    if isinstance(values, pd.Series):
        array = values.to_numpy()
        if array.dtype == object and len(array) and isinstance(array[0], np.ndarray):
            return np.stack(list(array))
        return array
    return np.asarray(values)
