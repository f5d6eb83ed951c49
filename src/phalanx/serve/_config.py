"""``ServeConfig``: how a checkpoint is served (address, workers, batching, limits)."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.errors import ConfigError

__all__ = ["ServeConfig"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServeConfig:
    """The server's settings.

    ``max_batch_size`` rows (summed over requests) or ``batch_wait_ms`` milliseconds, whichever
    comes first, make one model call; a single request larger than ``max_batch_size`` runs alone.
    ``max_body_bytes``: larger request bodies get HTTP 413. ``graceful_timeout_s``: how long a
    shutdown waits for requests in flight before closing their connections.

    Example::

        ServeConfig(port=8080, max_batch_size=512, batch_wait_ms=2)
    """

    host: str = LOOPBACK
    port: int = 8000
    workers: int = 1
    max_batch_size: int = 256
    batch_wait_ms: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    graceful_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        _check_int("port", self.port, 0, 65535)
        _check_int("workers", self.workers, 1, 1024)
        _check_int("max_batch_size", self.max_batch_size, 1, 10**9)
        _check_int("max_body_bytes", self.max_body_bytes, 1, 2**40)
        for name in ("batch_wait_ms", "graceful_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"ServeConfig({name}={value!r}) is invalid: it must be a number >= 0."
                )
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(
                f"ServeConfig(host={self.host!r}) is invalid.\nHINT: pass an address such as "
                f"{LOOPBACK!r} (this machine only) or '0.0.0.0' (every interface)."
            )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"ServeConfig({name}={value!r}) is invalid: it must be an int from {low} to {high}."
        )
