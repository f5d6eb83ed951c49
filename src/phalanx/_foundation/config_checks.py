"""Checks of ScalingConfig's placement fields (label_selector, use_tpu, topology), kept out of
phalanx.config's modules so they stay readable lists of fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from phalanx.errors import ConfigError

if TYPE_CHECKING:
    from phalanx.config import ScalingConfig


def _fail(name: str, value: object, allowed: str, hint: str = "") -> ConfigError:
    message = f"ScalingConfig({name}={value!r}) is invalid: {name} must be {allowed}."
    return ConfigError(message + (f"\nHINT: {hint}" if hint else ""))


def _is_selector(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def validate_placement_fields(scaling: ScalingConfig) -> None:
    """Types and combinations, as Ray checks them at construction."""
    selector = scaling.label_selector
    if selector is not None:
        if isinstance(selector, list):
            if not all(_is_selector(s) for s in selector):
                raise _fail("label_selector", selector, "a dict of str to str, or a list of them")
            if len(selector) != scaling.max_workers:  # elastic: one per possible worker
                raise _fail(
                    "label_selector",
                    selector,
                    f"one dict per worker ({scaling.max_workers}) when given as a list",
                    "pass a single dict to apply it to every worker.",
                )
        elif not _is_selector(selector):
            raise _fail("label_selector", selector, "a dict of str to str, or a list of them")
    if not isinstance(scaling.use_tpu, bool):
        raise _fail("use_tpu", scaling.use_tpu, "True or False")
    if scaling.use_tpu and scaling.use_gpu:
        raise _fail("use_tpu", True, "False when use_gpu=True", "pick GPUs or TPUs, not both.")
    if scaling.topology is not None:
        raise _fail(
            "topology",
            scaling.topology,
            "None",
            "phalanx does not reserve TPU slices by topology; request TPUs per worker with "
            "use_tpu=True (or resources_per_worker={'TPU': n}) on a Ray cluster.",
        )
    interval = scaling.elastic_resize_monitor_interval_s
    if not isinstance(interval, int | float) or isinstance(interval, bool) or not interval >= 0:
        raise _fail("elastic_resize_monitor_interval_s", interval, "a number of seconds >= 0")


def check_no_labels_locally(scaling: ScalingConfig) -> None:
    """Local processes run on this machine: node labels cannot select anything."""
    if scaling.label_selector is not None:
        raise ConfigError(
            f"ScalingConfig(label_selector={scaling.label_selector!r}) selects Ray nodes by "
            "label, but this run uses local processes on this machine.\n"
            "HINT: connect to the Ray cluster first (ray.init(address=...)), or drop "
            "label_selector."
        )


LOCAL_RUNTIME_ENV_KEYS = ("env_vars", "working_dir")


def validate_runtime_env(runtime_env: object) -> None:
    """``RunConfig(worker_runtime_env=...)``: a dict (or Ray's RuntimeEnv, a dict subclass)."""
    if runtime_env is None:
        return
    if not isinstance(runtime_env, dict):
        raise ConfigError(
            f"RunConfig(worker_runtime_env={runtime_env!r}) is invalid: worker_runtime_env must "
            "be None or a dict such as {'env_vars': {...}, 'working_dir': '...'}."
        )
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
    ):
        raise ConfigError(
            f"RunConfig(worker_runtime_env={runtime_env!r}) is invalid: env_vars must be a dict "
            "of str to str."
        )


def check_runtime_env_locally(runtime_env: Mapping[str, object] | None) -> None:
    """Local processes honour env_vars and working_dir; anything else needs Ray's runtime_env."""
    extra = sorted(set(runtime_env or {}) - set(LOCAL_RUNTIME_ENV_KEYS))
    if extra:
        raise ConfigError(
            f"RunConfig(worker_runtime_env=...) sets {extra}, which local worker processes "
            f"cannot honour (they take {', '.join(LOCAL_RUNTIME_ENV_KEYS)}).\n"
            "HINT: install the packages in this environment, or run on a Ray cluster "
            "(ray.init(address=...)) where Ray builds the runtime environment."
        )
