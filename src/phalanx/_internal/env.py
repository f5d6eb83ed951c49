"""Every environment variable phalanx reads, in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def ray_address() -> str | None:
    return os.environ.get("RAY_ADDRESS") or None


def default_storage_path() -> str:
    return os.environ.get("PHALANX_STORAGE_PATH") or os.path.expanduser("~/phalanx_results")


def user_cache_dir() -> str:
    """The user's own cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")


def engine_override() -> str | None:
    """``PHALANX_ENGINE=local|ray|thread`` forces an engine when ScalingConfig.engine is None."""
    return os.environ.get("PHALANX_ENGINE") or None


START_METHOD_VAR = "PHALANX_START_METHOD"


def start_method() -> str | None:
    """``PHALANX_START_METHOD=fork|spawn``: how the local engine starts workers (None: choose)."""
    return os.environ.get(START_METHOD_VAR, "").strip().lower() or None


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """The driver's environment now, with ``extra`` on top: what a spawned worker starts with."""
    return {**os.environ, **extra}


def worker_start_timeout_s() -> float:
    return float(os.environ.get("PHALANX_WORKER_START_TIMEOUT_S", "60"))


def ray_gcs_timeout_s() -> float:
    """How long the Ray engine waits for one answer of the Ray cluster's GCS (ray.nodes(), ...)."""
    return float(os.environ.get("PHALANX_RAY_GCS_TIMEOUT_S", "60"))


NOTICE_FILE_VAR = "PHALANX_NOTICE_FILE"


def notice_file() -> str | None:
    """Where a local worker reads the driver's preemption notice (set by the local engine)."""
    return os.environ.get(NOTICE_FILE_VAR)


def set_mlflow_tracking_token(token: str) -> None:
    """MLflow reads its tracking server's token only from the environment (as Ray sets it)."""
    os.environ["MLFLOW_TRACKING_TOKEN"] = token


def progress_interval_s() -> float:
    """How often the progress line is logged when the driver's output is not a terminal."""
    return float(os.environ.get("PHALANX_PROGRESS_INTERVAL_S", "30"))


def jax_platforms() -> str | None:
    """``JAX_PLATFORMS`` as the worker sees it now (set by the user, e.g. in a runtime env)."""
    return os.environ.get("JAX_PLATFORMS") or None


# Writes into the worker's environment. Frameworks (torch.distributed, Accelerate, NCCL, TF, Keras)
# read their configuration only from environment variables, so a worker's setup must set them;
# it does so through these helpers, so every read and write of os.environ stays in this module.


def get(name: str) -> str | None:
    """An environment variable a framework reads (phalanx's own have named functions above)."""
    return os.environ.get(name)


def is_set(name: str) -> bool:
    return name in os.environ


def set_var(name: str, value: str) -> None:
    os.environ[name] = value


def set_default(name: str, value: str) -> str:
    """Set ``name`` unless the user already did; returns the value in effect."""
    return os.environ.setdefault(name, value)


def update(values: Mapping[str, str]) -> None:
    os.environ.update(values)
