"""Optional dependencies: import one, or fail naming the phalanx extra that installs it.

``pip install phalanx`` installs only what every run needs (fsspec, cloudpickle). Everything else
comes with an extra (``pip install "phalanx[torch]"``); every place that imports an optional
package goes through :func:`require`, so a missing one is reported as what to install, never as
a bare ``No module named 'x'`` from deep inside phalanx.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["EXTRAS", "MissingDependencyError", "available", "missing", "require"]

# import name -> (phalanx extra, what pip installs). Kept in step with pyproject.toml's extras
# (tests/test_packaging.py checks that every extra named here exists there).
EXTRAS: dict[str, tuple[str, str]] = {
    "numpy": ("data", "numpy"),
    "pandas": ("data", "pandas"),
    "pyarrow": ("data", "pyarrow"),
    "torch": ("torch", "torch"),
    "xgboost": ("xgboost", "xgboost"),
    "lightgbm": ("lightgbm", "lightgbm"),
    "sklearn": ("sklearn", "scikit-learn"),
    "ray": ("ray", "ray[data]"),
    "s3fs": ("s3", "s3fs"),
    "gcsfs": ("gcs", "gcsfs"),
    "adlfs": ("azure", "adlfs"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
    "tensorboardX": ("tensorboard", "tensorboardX"),
    "matplotlib": ("plot", "matplotlib"),
    "lightning": ("lightning", "lightning"),
    "pytorch_lightning": ("lightning", "lightning"),
    "deepspeed": ("deepspeed", "deepspeed"),
    "transformers": ("transformers", "transformers"),
    "accelerate": ("transformers", "accelerate"),
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "tf_keras": ("tensorflow", "tf-keras"),
    "jax": ("jax", "jax"),
    "starlette": ("serve", "starlette"),
    "uvicorn": ("serve", "uvicorn"),
    "libcst": ("migrate", "libcst"),
    "prometheus_client": ("metrics", "prometheus_client"),
    "optuna": ("tune", "optuna"),
}


class MissingDependencyError(ModuleNotFoundError):
    """An optional package a phalanx feature needs is not installed.

    A ``ModuleNotFoundError`` (so ``except ImportError`` still catches it) whose message names the
    feature, the package and the ``pip install "phalanx[<extra>]"`` that installs it.
    """


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"xgboost"`` or ``"pyarrow.fs"``) for ``feature``.

    ``feature`` is what the user reached for (``"phalanx.xgboost"``, ``"Result.filesystem"``);
    ``extra`` overrides the package's own extra when the feature's is the better advice
    (``phalanx[lightning]`` rather than ``phalanx[torch]`` for ``phalanx.lightning``).
    A module that is installed but fails on a missing package of its own is reported the same
    way when that package is one phalanx knows; any other import error propagates unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS or isinstance(exc, MissingDependencyError):
            raise
        raise _error(top, feature, extra) from exc


def missing(feature: str, *modules: str, extra: str | None = None) -> MissingDependencyError | None:
    """The error for the first of ``modules`` that is not installed, else None; nothing is
    imported. For a package's guard, before its submodules import them::

        if _missing := missing("phalanx.xgboost", "xgboost", "pandas"):
            raise _missing
    """
    for module in modules:
        if not available(module):
            return _error(module.split(".")[0], feature, extra)
    return None


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a half-imported one
        return False


def _error(missing: str, feature: str, extra: str | None) -> MissingDependencyError:
    own_extra, package = EXTRAS[missing]
    extra = extra or own_extra
    return MissingDependencyError(
        f"{feature} needs the {package!r} package, which is not installed.\n"
        f'HINT: pip install "phalanx[{extra}]" (or pip install {package}).',
        name=missing,
    )
