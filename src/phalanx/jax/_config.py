"""JaxConfig: how ``jax.distributed`` is set up on the workers."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.backend import Backend, BackendConfig
from phalanx.errors import ConfigError

__all__ = ["JaxConfig"]


@dataclass
class JaxConfig(BackendConfig):
    """How JAX is set up on every worker before the training function starts.

    Every worker joins one ``jax.distributed`` cluster (rank 0 runs the coordinator), so
    ``jax.process_count()`` is the number of workers and ``jax.devices()`` lists every worker's
    devices. ``use_gpu``: one process per GPU (``JAX_PLATFORMS=cuda``); ``use_tpu``:
    ``JAX_PLATFORMS=tpu``; neither: CPU devices with gloo cross-process collectives (Ray Train
    sets nothing up on CPU; see docs/ray_differences.md). ``timeout_s``: how long ranks wait for
    each other to join.

    Example::

        JaxTrainer(train_func, jax_config=JaxConfig(use_gpu=True),
                   scaling_config=ScalingConfig(num_workers=4, use_gpu=True))
    """

    use_tpu: bool = False
    use_gpu: bool = False
    timeout_s: float = 300

    def __post_init__(self) -> None:
        for name in ("use_tpu", "use_gpu"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(
                    f"JaxConfig({name}={value!r}) is invalid: it must be True or False."
                )
        if self.use_tpu and self.use_gpu:
            raise ConfigError(
                "JaxConfig(use_tpu=True, use_gpu=True) is invalid: a JAX process uses one "
                "platform.\nHINT: set only one of them."
            )
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(
                f"JaxConfig(timeout_s={timeout!r}) is invalid: timeout_s must be a number of "
                "seconds > 0."
            )

    @property
    def backend_cls(self) -> type[Backend]:
        from phalanx.jax._backend import JaxBackend

        return JaxBackend

    @property
    def framework(self) -> str | None:
        return "jax"

    def to_dict(self) -> dict[str, object]:
        return {"use_tpu": self.use_tpu, "use_gpu": self.use_gpu, "timeout_s": self.timeout_s}
