"""Automatic mixed precision helpers of Ray Train's V1 API: accelerate, prepare_optimizer, backward.

Ray Train V2 turned these into errors; phalanx keeps them working, so V1 scripts port unchanged.
New code can use ``torch.autocast`` and ``torch.amp.GradScaler`` directly.

Example::

    phalanx.torch.accelerate(amp=True)          # before prepare_model
    model = phalanx.torch.prepare_model(model)  # forward now runs under autocast
    optimizer = phalanx.torch.prepare_optimizer(optimizer)
    phalanx.torch.backward(loss)                # scaled on GPU
    optimizer.step()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from phalanx._internal.worker.session import get_session
from phalanx.torch._devices import get_device

__all__ = ["accelerate", "backward", "prepare_optimizer"]


class _AmpState:
    """Per training run. A process can hold several runs' worth: ``num_workers=0`` runs the
    function in the driver, and workers forked from that driver later inherit its modules."""

    def __init__(self, owner: object = None) -> None:
        self.owner = owner  # the session of the run that set this state
        self.enabled = False
        self.scaler: torch.amp.GradScaler | None = None
        self.prepared = False


_state = _AmpState()


def _run_state() -> _AmpState:
    """This run's state, fresh the first time a run asks."""
    global _state
    session = get_session()
    if _state.owner is not session:
        _state = _AmpState(session)
    return _state


def accelerate(amp: bool = False) -> None:
    """Turn on automatic mixed precision for the models and optimizers prepared afterwards.

    Example::

        phalanx.torch.accelerate(amp=True)  # first, in the training function
        model = phalanx.torch.prepare_model(model)
        optimizer = phalanx.torch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        loss = model(x).sum()
        phalanx.torch.backward(loss)  # loss.backward(), scaled under AMP on a GPU
        optimizer.step()
    """
    state = _run_state()
    if state.prepared:
        raise RuntimeError(
            "phalanx.torch.accelerate() was called after prepare_model/prepare_optimizer.\n"
            "HINT: call accelerate(amp=True) once, before any prepare_* call."
        )
    state.enabled = bool(amp)
    state.scaler = None


def amp_enabled() -> bool:
    return _run_state().enabled


def mark_prepared() -> None:
    _run_state().prepared = True


def _scaler(device: torch.device) -> torch.amp.GradScaler | None:
    state = _run_state()
    # Loss scaling guards float16 gradients on GPU; CPU autocast uses bfloat16, which needs none.
    if state.scaler is None and state.enabled and device.type == "cuda":
        state.scaler = torch.amp.GradScaler("cuda")
    return state.scaler


class AutocastForward:
    """A model's ``forward`` run under ``torch.autocast``; picklable, unlike a closure."""

    def __init__(self, forward: Callable[..., Any], device_type: str) -> None:
        self.forward = forward
        self.device_type = device_type

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type):
            return self.forward(*args, **kwargs)


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """With AMP on a GPU, make ``optimizer.step()`` unscale gradients and update the scaler.

    Example::

        phalanx.torch.accelerate(amp=True)  # first, in the training function
        model = phalanx.torch.prepare_model(model)
        optimizer = phalanx.torch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        loss = model(x).sum()
        phalanx.torch.backward(loss)  # loss.backward(), scaled under AMP on a GPU
        optimizer.step()
    """
    mark_prepared()
    scaler = _scaler(get_device())
    if scaler is None:
        return optimizer
    return _ScaledOptimizer(optimizer, scaler)


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, with the loss scaled when AMP runs on a GPU.

    Example::

        phalanx.torch.accelerate(amp=True)  # first, in the training function
        model = phalanx.torch.prepare_model(model)
        optimizer = phalanx.torch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        loss = model(x).sum()
        phalanx.torch.backward(loss)  # loss.backward(), scaled under AMP on a GPU
        optimizer.step()
    """
    scaler = _scaler(tensor.device)
    if scaler is not None:
        scaler.scale(tensor).backward()
    else:
        tensor.backward()


class _ScaledOptimizer(torch.optim.Optimizer):
    """Delegates to the wrapped optimizer; ``step`` goes through the GradScaler."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        # Deliberately not calling Optimizer.__init__: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.scaler = scaler

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> Any:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: Any) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if closure is None:
            result = self.scaler.step(self.optimizer)
        else:
            result = self.scaler.step(self.optimizer, closure)
        self.scaler.update()
        return result

    def __repr__(self) -> str:
        return f"ScaledOptimizer({self.optimizer!r})"
