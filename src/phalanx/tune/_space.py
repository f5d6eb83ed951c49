"""Search spaces, with Ray Tune's names: ``choice``, ``uniform``, ``loguniform``, ``randint``,
``quniform``, ``sample_from``, ``grid_search`` and the rest of the family.

A space is a (nested) dict whose values are constants, :class:`Domain` objects (sampled once
per trial) or ``{"grid_search": [...]}`` (every value, one trial each). As in Ray, ``randint``
and ``lograndint`` exclude ``upper``; ``qrandint`` and ``qlograndint`` include it.

>>> import random
>>> space = {"lr": loguniform(1e-4, 1e-1), "layers": choice([2, 4]), "seed": 7}
>>> config = resolve(space, random.Random(0))
>>> sorted(config), config["seed"], 1e-4 <= config["lr"] <= 1e-1
(['layers', 'lr', 'seed'], 7, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from phalanx.errors import ConfigError

__all__ = [
    "Categorical",
    "Domain",
    "Float",
    "Function",
    "Integer",
    "choice",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "resolve",
    "sample_from",
    "uniform",
]

GRID_KEY = "grid_search"
Path = tuple[str, ...]


class Domain:
    """A value drawn once per trial."""

    def sample(self, rng: random.Random, spec: Any = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class Float(Domain):
    def __init__(
        self, lower: float, upper: float, log: bool = False, q: float | None = None
    ) -> None:
        _check_bounds("uniform" if not log else "loguniform", lower, upper, log)
        self.lower, self.upper, self.log, self.q = float(lower), float(upper), log, q

    def sample(self, rng: random.Random, spec: Any = None) -> float:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.lower), math.log(self.upper)))
        else:
            value = rng.uniform(self.lower, self.upper)
        if self.q is not None:
            value = round(value / self.q) * self.q
        return min(max(value, self.lower), self.upper) if self.q is None else value

    def __repr__(self) -> str:
        kind = "loguniform" if self.log else "uniform"
        q = f", q={self.q}" if self.q is not None else ""
        return f"{kind}({self.lower}, {self.upper}{q})"


class Normal(Domain):
    def __init__(self, mean: float, sd: float, q: float | None = None) -> None:
        if not sd > 0:
            raise ConfigError(f"randn(mean={mean}, sd={sd}) is invalid: sd must be > 0.")
        self.mean, self.sd, self.q = float(mean), float(sd), q

    def sample(self, rng: random.Random, spec: Any = None) -> float:
        value = rng.gauss(self.mean, self.sd)
        return round(value / self.q) * self.q if self.q is not None else value

    def __repr__(self) -> str:
        return f"randn({self.mean}, {self.sd})"


class Integer(Domain):
    """``[lower, upper)`` (``upper`` included when quantized, as Ray's ``qrandint``)."""

    def __init__(self, lower: int, upper: int, log: bool = False, q: int | None = None) -> None:
        _check_bounds("lograndint" if log else "randint", lower, upper, log)
        self.lower, self.upper, self.log, self.q = int(lower), int(upper), log, q

    def sample(self, rng: random.Random, spec: Any = None) -> int:
        if self.q is not None:  # inclusive upper bound
            if self.log:
                raw = math.exp(rng.uniform(math.log(self.lower), math.log(self.upper)))
            else:
                raw = rng.uniform(self.lower, self.upper)
            return int(min(max(round(raw / self.q) * self.q, self.lower), self.upper))
        if self.log:
            raw = math.exp(rng.uniform(math.log(self.lower), math.log(self.upper)))
            return min(int(raw), self.upper - 1)
        return rng.randrange(self.lower, self.upper)

    def __repr__(self) -> str:
        return f"{'lograndint' if self.log else 'randint'}({self.lower}, {self.upper})"


class Categorical(Domain):
    def __init__(self, categories: Sequence[Any]) -> None:
        categories = list(categories)
        if not categories:
            raise ConfigError("choice([]) is invalid: it needs at least one category.")
        self.categories = categories

    def sample(self, rng: random.Random, spec: Any = None) -> Any:
        return rng.choice(self.categories)

    def __repr__(self) -> str:
        return f"choice({self.categories!r})"


class Function(Domain):
    """``sample_from(fn)``: ``fn(spec)``, where ``spec.config`` is the trial's config so far."""

    def __init__(self, func: Callable[..., Any]) -> None:
        if not callable(func):
            raise ConfigError(f"sample_from({func!r}) is invalid: it takes a function.")
        self.func = func

    def sample(self, rng: random.Random, spec: Any = None) -> Any:
        try:
            return self.func(spec)
        except TypeError:
            return self.func()

    def __repr__(self) -> str:
        return f"sample_from({getattr(self.func, '__name__', self.func)!r})"


def _check_bounds(name: str, lower: float, upper: float, log: bool) -> None:
    if not lower < upper:
        raise ConfigError(
            f"{name}({lower}, {upper}) is invalid: lower must be below upper.\n"
            f"HINT: {name}({min(lower, upper)}, {max(lower, upper)})."
        )
    if log and lower <= 0:
        raise ConfigError(
            f"{name}({lower}, {upper}) is invalid: a log scale needs lower > 0.\n"
            f"HINT: use uniform/randint for ranges that include 0 or negative values."
        )


# -- Ray's functions ------------------------------------------------------------------------------


def uniform(lower: float, upper: float) -> Float:
    """A float drawn uniformly from ``[lower, upper)``.

    Example::

        tune.uniform(0.0, 1.0)
    """
    return Float(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Float:
    """A uniform float rounded to a multiple of ``q``.

    Example::

        tune.quniform(0.0, 1.0, 0.25)
    """
    return Float(lower, upper, q=q)


def loguniform(lower: float, upper: float, base: float = 10) -> Float:
    """A float drawn uniformly in log space between ``lower`` and ``upper``.

    Example::

        tune.loguniform(1e-4, 1e-1)
    """
    return Float(lower, upper, log=True)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    """A log-uniform float rounded to a multiple of ``q``.

    Example::

        tune.qloguniform(1e-4, 1e-1, 5e-5)
    """
    return Float(lower, upper, log=True, q=q)


def randint(lower: int, upper: int) -> Integer:
    """An integer from ``lower`` (included) to ``upper`` (excluded), as Ray.

    Example::

        tune.randint(1, 10)
    """
    return Integer(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """A uniform integer rounded to a multiple of ``q`` (``upper`` included, as Ray).

    Example::

        tune.qrandint(8, 64, 8)
    """
    return Integer(lower, upper, q=q)


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    """An integer drawn uniformly in log space, ``upper`` excluded.

    Example::

        tune.lograndint(1, 1000)
    """
    return Integer(lower, upper, log=True)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Integer:
    """A log-uniform integer rounded to a multiple of ``q``.

    Example::

        tune.qlograndint(8, 1024, 8)
    """
    return Integer(lower, upper, log=True, q=q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A float from a normal distribution.

    Example::

        tune.randn(0.0, 1.0)
    """
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Normal:
    """A normal float rounded to a multiple of ``q``.

    Example::

        tune.qrandn(0.0, 1.0, 0.1)
    """
    return Normal(mean, sd, q=q)


def choice(categories: Sequence[Any]) -> Categorical:
    """One of ``categories``, each equally likely.

    Example::

        tune.choice([16, 32, 64])
    """
    return Categorical(categories)


def sample_from(func: Callable[..., Any]) -> Function:
    """A value computed from the rest of the trial's config: ``func(spec)`` with
    ``spec.config`` the resolved config (Ray's form).

    Example::

        tune.sample_from(lambda spec: spec.config.width * 2)
    """
    return Function(func)


def grid_search(values: Iterable[Any]) -> dict[str, list[Any]]:
    """Every value, one trial each (times ``num_samples``), as Ray's ``{"grid_search": [...]}``.

    Example::

        param_space={"lr": tune.grid_search([1e-3, 1e-2, 1e-1])}
    """
    values = list(values)
    if not values:
        raise ConfigError("grid_search([]) is invalid: it needs at least one value.")
    return {GRID_KEY: values}


# -- walking a space ------------------------------------------------------------------------------


def is_grid(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and GRID_KEY in value


def leaves(space: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every value of a nested dict that is not itself a dict (a grid counts as one leaf)."""
    if isinstance(space, dict) and not is_grid(space):
        for key, value in space.items():
            yield from leaves(value, (*path, str(key)))
    else:
        yield path, space


def grid_paths(space: dict[str, Any]) -> list[Path]:
    return [path for path, value in leaves(space) if is_grid(value)]


def domain_paths(space: dict[str, Any]) -> list[Path]:
    return [path for path, value in leaves(space) if isinstance(value, Domain)]


def get_path(config: dict[str, Any], path: Path) -> Any:
    value: Any = config
    for key in path:
        value = value[key]
    return value


def set_path(config: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        config = config[key]
    config[path[-1]] = value


def copy_space(space: Any) -> Any:
    """Dicts copied (grid values and domains kept as they are)."""
    if isinstance(space, dict) and not is_grid(space):
        return {key: copy_space(value) for key, value in space.items()}
    return space


def grid_combinations(space: dict[str, Any]) -> list[dict[Path, Any]]:
    """Every combination of the grid values, the first grid key varying fastest (Ray's order)."""
    paths = grid_paths(space)
    combos: list[dict[Path, Any]] = [{}]
    for path in paths:
        values = get_path(space, path)[GRID_KEY]
        # the combinations so far repeat for each value: earlier paths vary faster
        combos = [{**combo, path: value} for value in values for combo in combos]
    return combos


class _Spec:
    """What ``sample_from`` functions get: ``spec.config`` (attribute or item access)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = _AttrDict(config)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


class _AttrDict(dict):  # type: ignore[type-arg]
    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc
        return _AttrDict(value) if isinstance(value, dict) else value


def resolve(
    space: dict[str, Any], rng: random.Random, grid: dict[Path, Any] | None = None
) -> dict[str, Any]:
    """One config: grid values from ``grid``, domains sampled, ``sample_from`` last."""
    config = copy_space(space)
    for path, value in (grid or {}).items():
        set_path(config, path, value)
    functions = []
    for path, value in leaves(config):
        if is_grid(value):
            set_path(config, path, rng.choice(value[GRID_KEY]))
        elif isinstance(value, Function):
            functions.append(path)
        elif isinstance(value, Domain):
            set_path(config, path, value.sample(rng))
    for path in functions:
        set_path(config, path, get_path(config, path).sample(rng, _Spec(config)))
    return config
