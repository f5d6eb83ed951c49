"""What this machine can give local workers: CPUs, GPUs, memory. Checked before any worker starts."""

from __future__ import annotations

import math
import os

from phalanx._foundation import env
from phalanx.config import ScalingConfig
from phalanx.errors import ConfigError

LOCAL_RESOURCES = ("CPU", "GPU", "memory")


def visible_gpu_ids() -> list[int]:
    """Physical GPU ids this process may use, without importing torch."""
    if _count_nvidia_gpus() == 0:
        return []
    visible = env.cuda_visible_devices()
    if visible is None:
        return list(range(_count_nvidia_gpus()))
    return [int(item) for item in visible.split(",") if item.strip().isdigit()]


def _count_nvidia_gpus() -> int:
    proc = "/proc/driver/nvidia/gpus"
    if os.path.isdir(proc):
        return len(os.listdir(proc))
    return len([d for d in _safe_listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])


def _safe_listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def check_local_resources(scaling: ScalingConfig) -> None:
    from phalanx._foundation.config_checks import check_no_labels_locally

    check_no_labels_locally(scaling)
    n = scaling.max_workers  # elastic (min, max) is resolved to one size before this
    extra = set(scaling.additional_resources_per_worker) - set(LOCAL_RESOURCES)
    if extra:
        raise ConfigError(
            f"ScalingConfig(resources_per_worker={scaling.resources_per_worker!r}) asks for "
            f"{sorted(extra)}, which local workers cannot have (only {', '.join(LOCAL_RESOURCES)}).\n"
            "HINT: custom resources need a Ray cluster: ray.init(address=...) before fit()."
        )
    if scaling.use_gpu:
        gpus = visible_gpu_ids()
        wanted = scaling.num_gpus_per_worker * n
        if wanted > len(gpus):
            raise ConfigError(
                f"ScalingConfig(use_gpu=True, num_workers={n}) needs {wanted:g} GPU(s) but this "
                f"machine has {len(gpus)} visible.\nHINT: set use_gpu=False, lower num_workers, "
                "or check CUDA_VISIBLE_DEVICES."
            )
    if scaling.resources_per_worker and "CPU" in scaling.resources_per_worker:
        cpus = os.cpu_count() or 1
        wanted = scaling.num_cpus_per_worker * n
        if wanted > cpus:
            raise ConfigError(
                f"ScalingConfig(num_workers={n}, resources_per_worker="
                f"{scaling.resources_per_worker!r}) needs {wanted:g} CPUs but this machine has "
                f"{cpus}.\nHINT: lower num_workers or the CPU per worker."
            )
    memory = (scaling.resources_per_worker or {}).get("memory", 0)
    total = _total_memory()
    if memory and total and memory * n > total:
        raise ConfigError(
            f"ScalingConfig(resources_per_worker={scaling.resources_per_worker!r}) needs "
            f"{memory * n / 2**30:.1f} GiB of memory for {n} workers; this machine has "
            f"{total / 2**30:.1f} GiB.\nHINT: lower memory per worker or num_workers."
        )


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def local_gpu_ids(scaling: ScalingConfig) -> list[tuple[int, ...]]:
    """The GPU ids of each worker, in launch order (empty tuples without GPUs)."""
    n = scaling.max_workers  # elastic (min, max) is resolved to one size before this
    if not scaling.use_gpu:
        return [() for _ in range(n)]
    per_worker = max(1, math.ceil(scaling.num_gpus_per_worker))
    gpus = visible_gpu_ids()
    if scaling.num_gpus_per_worker < 1:  # fractional: workers share GPUs round-robin
        return [(gpus[i % len(gpus)],) for i in range(n)]
    return [tuple(gpus[i * per_worker : (i + 1) * per_worker]) for i in range(n)]
