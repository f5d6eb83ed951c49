"""What the TensorFlow backend runs inside each worker: port, ``TF_CONFIG``, Keras flavour.

Module-level functions, sent to the workers by reference by
:class:`~phalanx.tensorflow._backend.TensorflowBackend`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import sys
from types import TracebackType

import phalanx.session as session
from phalanx._foundation import env
from phalanx._gbdt.addresses import reserve_port
from phalanx.errors import ConfigError

__all__ = ["TrainFuncContext", "release_port", "reserve_port_on_rank", "set_tf_config"]

logger = logging.getLogger(__name__)

LEGACY_KERAS_VAR = "TF_USE_LEGACY_KERAS"

# The bound socket that keeps this worker's port taken until TensorFlow's server needs it.
_reserved: dict[str, socket.socket] = {}


def reserve_port_on_rank(hosts: list[str]) -> int:
    """Reserve a free port on this rank's address (``hosts[rank]``); return it."""
    release_port()
    sock = reserve_port(hosts[session.get_context().get_world_rank()])
    _reserved["socket"] = sock
    return int(sock.getsockname()[1])


def release_port() -> None:
    sock = _reserved.pop("socket", None)
    if sock is not None:
        sock.close()


def set_tf_config(workers: list[str]) -> None:
    """``TF_CONFIG`` naming every worker, this one by its world rank; Keras 2 by default."""
    rank = session.get_context().get_world_rank()
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
    env.set_var("TF_CONFIG", json.dumps(tf_config))
    legacy = env.set_default(LEGACY_KERAS_VAR, "1") in ("1", "true", "True")
    if legacy and not _missing("tf_keras"):
        _route_tf_keras_to_keras_2()
    if legacy and _missing("tf_keras"):
        raise ConfigError(
            "TF_USE_LEGACY_KERAS=1 (Keras 2, which MultiWorkerMirroredStrategy needs in "
            "model.fit) but tf-keras is not installed on this worker.\n"
            'HINT: pip install "phalanx[tensorflow]" (or pip install tf-keras matching your '
            "TensorFlow version)."
        )


def _route_tf_keras_to_keras_2() -> None:
    """A worker forked from a driver whose ``tf.keras`` already resolved to Keras 3 (the driver
    used it, or imported a library that did) inherits that binding, and ``model.fit`` under
    ``MultiWorkerMirroredStrategy`` then fails. ``tf.keras`` is put back to TensorFlow's lazy
    loader, which reads ``TF_USE_LEGACY_KERAS`` (now set) on first use."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return  # imported later, it reads TF_USE_LEGACY_KERAS itself
    from tensorflow.python.util.lazy_loader import KerasLazyLoader

    bound = vars(tf).get("keras")
    if isinstance(bound, KerasLazyLoader):
        if not vars(bound).get("_tfll_initialized"):
            return
        if vars(bound).get("_tfll_keras_version") == "tf_keras":
            return
    elif getattr(bound, "__name__", "").startswith("tf_keras"):
        return
    logger.debug("tf.keras was bound to Keras 3 before this worker started; rebinding it.")
    vars(tf)["keras"] = KerasLazyLoader(vars(tf))


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


class TrainFuncContext:
    """Wraps the training function on every rank: frees the reserved port for TensorFlow's
    server (started by ``MultiWorkerMirroredStrategy()``), and frees it at the end if unused."""

    def __enter__(self) -> TrainFuncContext:
        release_port()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        release_port()
