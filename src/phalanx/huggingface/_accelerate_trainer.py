"""AccelerateTrainer: AIR's ``TorchTrainer`` that applied an ``accelerate config`` (deprecated).

Ray 2.4-2.6 shipped it; Ray removed it in favour of creating an ``Accelerator`` inside a
``TorchTrainer`` training function, which phalanx supports (the worker's process group and
device are set up the way ``accelerate launch`` would). What the class adds is the
configuration: ``accelerate_config`` (a dict, a file written by ``accelerate config``, or None
for Accelerate's default file) is read on the driver, turned into the environment variables
``accelerate launch`` sets, and set in every worker before the training function runs.

The settings ``accelerate launch`` takes from the cluster (machines, processes, ranks, GPU ids,
main process address, CPU mode) come from phalanx's ``ScalingConfig`` instead and are ignored,
as AIR did. DeepSpeed, FSDP and Megatron-LM configurations are refused with a hint: pass the
plugin to ``Accelerator(...)`` in the training function.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from phalanx._foundation import env
from phalanx._internal.worker.session import _takes_config
from phalanx.checkpoint import Checkpoint
from phalanx.config import DataConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.torch import TorchConfig, TorchTrainer

logger = logging.getLogger(__name__)

# Accelerate's settings as given or read from its YAML/JSON file: values of any shape, checked
# where a setting is applied.
AccelerateSettings = Mapping[str, Any]

__all__ = ["AccelerateTrainer"]

DEPRECATION = (
    "AccelerateTrainer is deprecated: Ray removed it in favour of an Accelerator created inside "
    "a TorchTrainer training function. The modern form:\n"
    "    def train_func(config): accelerator = Accelerator(mixed_precision=..., "
    "gradient_accumulation_steps=...)  # the accelerate_config, as arguments; then the loop\n"
    "    TorchTrainer(train_func, train_loop_config=train_loop_config, "
    "scaling_config=scaling_config, datasets=datasets).fit()"
)

# What `accelerate launch` takes from the cluster; phalanx's ScalingConfig decides these.
FROM_THE_CLUSTER = frozenset(
    {
        "compute_environment",
        "num_machines",
        "num_processes",
        "machine_rank",
        "gpu_ids",
        "num_cpu_threads_per_process",
        "main_process_ip",
        "main_process_port",
        "same_network",
        "use_cpu",
        "cpu",
        "rdzv_backend",
        "main_training_function",
        "enable_cpu_affinity",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_name",
        "tpu_zone",
        "commands",
        "command_file",
    }
)
DATA_PARALLEL_TYPES = frozenset({"NO", "MULTI_GPU", "MULTI_CPU"})
PLUGIN_SECTIONS = ("deepspeed_config", "fsdp_config", "megatron_lm_config")
PRECISIONS = ("no", "fp16", "bf16", "fp8")


class AccelerateTrainer(TorchTrainer):
    """AIR's ``AccelerateTrainer`` (deprecated): a ``TorchTrainer`` whose workers start with
    ``accelerate_config`` applied, so ``Accelerator()`` in ``train_loop_per_worker`` picks it
    up (mixed precision, gradient accumulation, dynamo, debug mode).

    Example::

        def train_loop_per_worker():
            accelerator = Accelerator()  # bf16, from the config
            model, optimizer = accelerator.prepare(model, optimizer)
            ...
            phalanx.report({"loss": loss.item()})

        AccelerateTrainer(
            train_loop_per_worker,
            accelerate_config={"mixed_precision": "bf16"},  # or a path, or None
            scaling_config=phalanx.ScalingConfig(num_workers=2),
        ).fit()
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., object],
        *,
        train_loop_config: dict[str, Any] | None = None,
        accelerate_config: dict[str, Any] | str | os.PathLike[str] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        preprocessor: object = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        self.accelerate_config = accelerate_config
        variables = launch_environment(load_accelerate_config(accelerate_config))
        super().__init__(
            functools.partial(_with_environment, variables, train_loop_per_worker),
            train_loop_config=train_loop_config,
            torch_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
        )


def load_accelerate_config(config: object) -> AccelerateSettings:
    """The configuration as a dict: given, read from a YAML/JSON file, or Accelerate's default
    file (``accelerate config`` writes it; none there means Accelerate's defaults)."""
    if isinstance(config, Mapping):
        return dict(config)
    if config is None:
        from accelerate.commands.config import default_config_file

        if not os.path.isfile(default_config_file):
            return {}
        config = default_config_file
    if not isinstance(config, (str, os.PathLike)) or not os.path.isfile(config):
        raise ConfigError(
            f"accelerate_config={config!r} is invalid: it must be a dict, the path of an "
            "existing file written by `accelerate config`, or None.\nHINT: check the path, or "
            "pass the settings as a dict: accelerate_config={'mixed_precision': 'bf16'}."
        )
    with open(config) as f:
        if str(config).endswith(".json"):
            loaded = json.load(f)
        else:
            import yaml

            loaded = yaml.safe_load(f)
    return dict(loaded or {})


def launch_environment(config: AccelerateSettings) -> dict[str, str]:
    """The variables ``accelerate launch`` would set for ``config``, minus the cluster's.

    >>> launch_environment({"mixed_precision": "BF16", "num_processes": 8})
    {'ACCELERATE_MIXED_PRECISION': 'bf16'}
    """
    _refuse_plugins(config)
    variables: dict[str, str] = {}
    dynamo = dict(config.get("dynamo_config") or {})
    if "dynamo_backend" in config:  # accelerate < 0.18 wrote it at the top level
        dynamo.setdefault("dynamo_backend", config["dynamo_backend"])
    for key, value in config.items():
        if key in FROM_THE_CLUSTER or key in PLUGIN_SECTIONS or value is None:
            continue
        if key == "mixed_precision":
            variables["ACCELERATE_MIXED_PRECISION"] = _precision(value)
        elif key == "gradient_accumulation_steps":
            variables["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(int(value))
        elif key == "downcast_bf16":
            variables["ACCELERATE_DOWNCAST_BF16"] = str(_truthy(value)).lower()
        elif key == "debug":
            variables["ACCELERATE_DEBUG_MODE"] = str(_truthy(value)).lower()
        elif key not in ("dynamo_config", "dynamo_backend", "distributed_type"):
            logger.warning("accelerate_config[%r] is not applied by AccelerateTrainer.", key)
    for name, value in dynamo.items():
        variables[f"ACCELERATE_{name.upper()}"] = (
            str(value).upper() if name == "dynamo_backend" else str(value)
        )
    return variables


def _refuse_plugins(config: AccelerateSettings) -> None:
    kind = str(config.get("distributed_type", "NO")).upper().removeprefix("DISTRIBUTEDTYPE.")
    plugins = [s for s in PLUGIN_SECTIONS if config.get(s)]
    if kind in DATA_PARALLEL_TYPES and not plugins:
        return
    raise ConfigError(
        f"accelerate_config asks for {kind if kind not in DATA_PARALLEL_TYPES else plugins[0]}, "
        "which AccelerateTrainer does not set up from a config file (phalanx starts the "
        "workers as plain data-parallel ranks).\nHINT: pass the plugin to the Accelerator in "
        "the training function, e.g. Accelerator(deepspeed_plugin=DeepSpeedPlugin(...)) or "
        "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...)), with a TorchTrainer."
    )


def _precision(value: object) -> str:
    precision = str(value).lower()
    if precision not in PRECISIONS:
        raise ConfigError(
            f"accelerate_config['mixed_precision']={value!r} is invalid: it must be one of "
            f"{list(PRECISIONS)}.\nHINT: 'bf16' on CPUs and recent GPUs, 'fp16' on older GPUs."
        )
    return precision


def _truthy(value: object) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def _with_environment(
    variables: dict[str, str],
    train_loop_per_worker: Callable[..., object],
    config: dict[str, object],
) -> object:
    """In the worker: the configuration's variables, then the user's function."""
    env.update(variables)
    if _takes_config(train_loop_per_worker):
        return train_loop_per_worker(config)
    return train_loop_per_worker()
