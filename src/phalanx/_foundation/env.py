"""Every environment variable phalanx reads, in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


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


RESTORE_MODE_VAR = "PHALANX_RESTORE_MODE"


def restore_mode() -> str:
    """How the Ray and local engines restart a failed group: ``in-place`` (keep the surviving
    actors or processes, replace the lost ones) or ``full`` (new actors for every rank, as Ray Train)."""
    mode = os.environ.get(RESTORE_MODE_VAR, "in-place").strip().lower()
    if mode not in ("in-place", "full"):
        raise ValueError(
            f"{RESTORE_MODE_VAR}={mode!r} is not a restore mode. HINT: set it to in-place or full."
        )
    return mode


PRESTART_VAR = "PHALANX_RESTORE_PRESTART"


def restore_prestart() -> str:
    """Whether in-place recovery starts the lost workers' new actors while the survivors are
    reset: ``auto`` (when the group spans machines), ``on`` or ``off``."""
    value = os.environ.get(PRESTART_VAR, "auto").strip().lower()
    if value not in ("auto", "on", "off"):
        raise ValueError(f"{PRESTART_VAR}={value!r} is invalid. HINT: set it to auto, on or off.")
    return value


FENCE_VAR = "PHALANX_FENCE_S"


def fence_s() -> float:
    """How long a Ray worker goes without hearing from its driver before it stops itself (the
    floor: the worker waits longer where the driver's calls came slower, ``worker/fence.py``);
    0 turns fencing off."""
    return float(os.environ.get(FENCE_VAR, "5"))


S3_CONDITIONS_VAR = "PHALANX_S3_CONDITIONAL_WRITES"


def s3_conditional_writes() -> bool:
    """Whether the driver writes its run files and the lease on S3 with If-Match/If-None-Match
    (storage/object_store.py); off for an S3-compatible server that does not take them."""
    return os.environ.get(S3_CONDITIONS_VAR, "1").strip().lower() not in ("0", "false", "off")


PEER_RECOVERY_VAR = "PHALANX_PEER_RECOVERY"


def peer_recovery() -> bool:
    """Whether a restarted attempt may resume from the survivors' state (phalanx.torch)."""
    return os.environ.get(PEER_RECOVERY_VAR, "1").strip().lower() not in ("0", "false", "off")


def reuse_stop_s() -> float:
    """How long a surviving worker gets to end its training call before it is replaced."""
    return float(os.environ.get("PHALANX_REUSE_STOP_S", "10"))


def host_silent_s() -> float:
    """The longest a host whose Ray workers all stopped answering the driver is waited for
    before it is declared lost (the cap of the adaptive bound, engines/ray/liveness.py)."""
    value = os.environ.get("PHALANX_HOST_SILENT_S", "3")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(
            f"PHALANX_HOST_SILENT_S={value!r} is invalid. HINT: set it to a number of seconds "
            "above 0 (default 3)."
        )
    return seconds


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


def metrics_address() -> tuple[str, int] | None:
    """``PHALANX_METRICS_PORT`` (and ``PHALANX_METRICS_HOST``, default 127.0.0.1): where the
    driver serves a run's Prometheus metrics; None when the port is unset."""
    port = os.environ.get("PHALANX_METRICS_PORT", "").strip()
    if not port:
        return None
    return os.environ.get("PHALANX_METRICS_HOST", "").strip() or "127.0.0.1", int(port)


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


HANG_FLOOR_VAR = "PHALANX_HANG_TIMEOUT_FLOOR_S"


def hang_timeout_floor_s() -> float:
    """The floor of the default hang rule (``FailureConfig(hang_timeout_s="auto")``): 30 min."""
    return float(os.environ.get(HANG_FLOOR_VAR, "1800"))


SAVE_STATE_TIMEOUT_VAR = "PHALANX_SAVE_STATE_TIMEOUT_S"


def save_state_timeout_s() -> float:
    """How long ``phalanx.torch.save_state`` waits for every rank to call it too: 300 s."""
    return float(os.environ.get(SAVE_STATE_TIMEOUT_VAR, "300"))


def straggler_detection() -> bool:
    """``PHALANX_STRAGGLER_DETECTION=0`` silences straggler detection (on by default)."""
    return os.environ.get("PHALANX_STRAGGLER_DETECTION", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def replica_check() -> bool:
    """``PHALANX_REPLICA_CHECK=0`` turns the replica agreement check off (on by default); read
    where ``prepare_model`` runs, in each worker."""
    return os.environ.get("PHALANX_REPLICA_CHECK", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


# -- the table of phalanx's own variables ---------------------------------------------------------
# One row per PHALANX_* variable read above, with its default as the reader applies it: the docs'
# environment-variables page is generated from it (docs/gen_env_page.py) and
# tests/test_env_table.py checks that every PHALANX_* name in this module has a row whose default
# is the one its reader uses. A new variable: its reader above, its row here.


@dataclass(frozen=True)
class Variable:
    """One environment variable phalanx reads: its name, its default (``None``: unset, the
    behaviour ``meaning`` describes) and what it changes."""

    name: str
    default: str | None
    meaning: str
    set_by_phalanx: bool = False  # phalanx sets it for its own workers; not for users


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "PHALANX_STORAGE_PATH",
        "~/phalanx_results",
        "Where runs go when `RunConfig(storage_path=None)`, and where the `phalanx` command looks "
        "for runs by name (a local path or a URI).",
    ),
    Variable(
        "PHALANX_ENGINE",
        None,
        "`local`, `ray` or `thread`: the engine when `ScalingConfig(engine=None)`. Unset: Ray when "
        "Ray is initialised or `RAY_ADDRESS` is set, else local processes.",
    ),
    Variable(
        "PHALANX_START_METHOD",
        None,
        "`fork` or `spawn`: how local workers start. Unset: the fork server on Linux where forking "
        "is safe, else spawned interpreters (see Platforms).",
    ),
    Variable(
        "PHALANX_WORKER_START_TIMEOUT_S",
        "60",
        "Seconds a worker (or an elastic group's `min_workers`) gets to start and say hello "
        "before the attempt fails with `WorkerStartupError`.",
    ),
    Variable(
        "PHALANX_RAY_GCS_TIMEOUT_S",
        "60",
        "Seconds the Ray engine waits for one answer of the cluster's GCS before "
        "`RayClusterUnresponsiveError`.",
    ),
    Variable(
        "PHALANX_RESTORE_MODE",
        "in-place",
        "`in-place`: a retry keeps the surviving actors (Ray) or processes (local) and replaces "
        "only the lost ranks; "
        "`full`: every rank anew, as Ray Train does.",
    ),
    Variable(
        "PHALANX_PEER_RECOVERY",
        "1",
        "`0`: after in-place recovery, save_state loops resume from the last committed "
        "checkpoint instead of the survivors' state at the failed step.",
    ),
    Variable(
        "PHALANX_RESTORE_PRESTART",
        "auto",
        "`auto`, `on` or `off`: whether in-place recovery starts the lost ranks' new actors while "
        "the survivors are reset (`auto`: when the group spans machines).",
    ),
    Variable(
        "PHALANX_REUSE_STOP_S",
        "10",
        "Seconds a surviving worker gets to end its training call before it is replaced too.",
    ),
    Variable(
        "PHALANX_HOST_SILENT_S",
        "3",
        "Seconds at most a host whose Ray workers all stop answering the driver is waited for "
        "before it is declared lost (the bound adapts below it; see the networks guide).",
    ),
    Variable(
        "PHALANX_PROGRESS_INTERVAL_S",
        "30",
        "How often the progress line is logged when the driver's stderr is not a terminal.",
    ),
    Variable(
        "PHALANX_METRICS_PORT",
        None,
        "A port: the driver serves the run's Prometheus metrics at `/metrics` for the length of "
        "`fit()`. Unset: no endpoint.",
    ),
    Variable(
        "PHALANX_METRICS_HOST",
        "127.0.0.1",
        "The address of that endpoint (`0.0.0.0` offers it to the network).",
    ),
    Variable(
        "PHALANX_HANG_TIMEOUT_FLOOR_S",
        "1800",
        'The floor of the default hang rule (`hang_timeout_s="auto"`): a rank is hung after no '
        "progress for the larger of this and 10x the slowest round.",
    ),
    Variable(
        "PHALANX_SAVE_STATE_TIMEOUT_S",
        "300",
        "Seconds `phalanx.torch.save_state`/`load_state` wait for every rank to call them too.",
    ),
    Variable(
        "PHALANX_STRAGGLER_DETECTION",
        "1",
        "`0` (or `false`, `no`, `off`) silences straggler detection.",
    ),
    Variable(
        "PHALANX_REPLICA_CHECK",
        "1",
        "`0` (or `false`, `no`, `off`) in the workers' environment turns off the replica agreement "
        "check of models wrapped by `prepare_model` (as `replica_check=False`).",
    ),
    Variable(
        "PHALANX_FENCE_S",
        "5",
        "Seconds a Ray worker goes without a call from its driver before it stops itself and "
        "every process it started (longer where the driver's calls came slower); `0`: never.",
    ),
    Variable(
        "PHALANX_S3_CONDITIONAL_WRITES",
        "1",
        "`0`: the driver writes its run files and the lease on S3 unconditionally (for an "
        "S3-compatible server without `If-Match`/`If-None-Match` on PUT; a late write of a "
        "driver given up can then replace the new driver's).",
    ),
    Variable(
        "PHALANX_NOTICE_FILE",
        None,
        "Where a local worker reads the driver's preemption notice.",
        set_by_phalanx=True,
    ),
)
