"""Ray Train 2.60's public API, name by name, against phalanx's (see surface_check.py).

Every public name of ``ray.train``, ``ray.train.torch``, ``ray.train.xgboost``,
``ray.train.lightgbm``, ``ray.train.collective``, ``ray.train.lightning``,
``ray.train.huggingface.transformers``, ``ray.train.tensorflow``, ``ray.train.v2.jax`` and
``ray.train.horovod`` must exist in the matching phalanx module
with a compatible signature, or be listed in docs/ray_differences.md.
"""

from __future__ import annotations

import importlib

import pytest
from surface_check import check_module, excusing_row, import_ray_horovod, load_differences

ray_train = pytest.importorskip("ray.train")
from ray.train.v2._internal.constants import is_v2_enabled  # noqa: E402

import_ray_horovod()  # ray.train.horovod imports horovod, which does not build here

MODULES = {
    "ray.train": "phalanx",
    "ray.train.torch": "phalanx.torch",
    "ray.train.xgboost": "phalanx.xgboost",
    "ray.train.lightgbm": "phalanx.lightgbm",
    "ray.train.collective": "phalanx.collective",
    "ray.train.lightning": "phalanx.lightning",
    "ray.train.huggingface.transformers": "phalanx.huggingface.transformers",
    "ray.train.v2.jax": "phalanx.jax",
    "ray.train.horovod": "phalanx.horovod",
    "ray.train.tensorflow": "phalanx.tensorflow",
}

# Names another part of issue 14 (14b, the AIR-era part) delivers; strict, so the mark must go
# once they match.
IN_PROGRESS: dict[str, str] = {}  # "ray.module.Name" -> why it is still missing (strict xfail)

TABLE = load_differences()


def _names() -> list[tuple[str, str, str]]:
    names = []
    for ray_name, phalanx_name in MODULES.items():
        module = importlib.import_module(ray_name)
        names += [(ray_name, phalanx_name, name) for name in sorted(module.__all__)]
    return names


def _param(ray_name: str, phalanx_name: str, name: str) -> pytest.param:  # type: ignore[valid-type]
    key = f"{ray_name}.{name}"
    marks = [pytest.mark.xfail(reason=IN_PROGRESS[key], strict=True)] if key in IN_PROGRESS else []
    return pytest.param(ray_name, phalanx_name, name, id=key, marks=marks)


def test_the_contract_is_ray_train_v2():
    assert is_v2_enabled(), "compare with Ray Train V2: unset RAY_TRAIN_V2_ENABLED"
    assert "get_all_reported_checkpoints" in ray_train.__all__


@pytest.mark.parametrize(("ray_name", "phalanx_name", "name"), [_param(*n) for n in _names()])
def test_ray_name_is_in_phalanx(ray_name, phalanx_name, name):
    ray_module = importlib.import_module(ray_name)
    phalanx_module = importlib.import_module(phalanx_name)
    problems, _ = check_module(ray_module, phalanx_module, TABLE, names=[name])
    assert not problems, "undocumented differences from Ray:\n" + "\n".join(problems)


def test_every_row_of_the_table_is_still_needed():
    used: set[str] = set()
    for ray_name, phalanx_name in MODULES.items():
        ray_module = importlib.import_module(ray_name)
        _, rows = check_module(ray_module, importlib.import_module(phalanx_name), TABLE)
        used |= rows
    ours = {row for row in TABLE if row.rsplit(".", 1)[0].split("(")[0] in _owners()}
    assert ours - used == set(), "rows that excuse nothing any more: remove them"


def _owners() -> set[str]:
    """Table rows whose Ray name lives in one of MODULES (row prefix before the last dot)."""
    owners = set(MODULES)
    for ray_name in MODULES:
        module = importlib.import_module(ray_name)
        owners |= {f"{ray_name}.{name}" for name in module.__all__}
    return owners


def test_every_row_has_a_reason_and_an_alternative():
    assert TABLE, "docs/ray_differences.md has no table"
    for name, (reason, instead) in TABLE.items():
        assert name.startswith("ray."), name
        assert len(reason) > 20 and instead, name


def test_the_checker_catches_a_difference():
    """A checker that passes everything proves nothing: feed it a known mismatch."""
    import types

    ray_like = types.ModuleType("ray.fake")
    ray_like.__all__ = ["f", "g", "C"]

    def f(a, b=1, *, c=None): ...

    class C:
        def method(self, x, y=2): ...

    ray_like.f, ray_like.g, ray_like.C = f, f, C
    phx = types.ModuleType("phx")

    def f2(a, b=2, *, c=None, extra=0): ...

    class C2:
        def method(self, y, x=2): ...

    phx.f, phx.C = f2, C2
    C.__module__ = "ray.fake"
    problems, _ = check_module(ray_like, phx, {"ray.fake.g": ("", "")})
    keys = sorted(p.split(": ")[0] for p in problems)
    assert keys == [
        "ray.fake.C.method(*)",
        "ray.fake.C.method(x)",
        "ray.fake.C.method(y)",
        "ray.fake.f(b)",
    ]
    assert excusing_row("ray.fake.g", {"ray.fake.g": 1}) == "ray.fake.g"


def test_constants_match_ray():
    import ray.train.constants

    import phalanx
    import phalanx.constants

    for name in phalanx.constants.__all__:
        assert getattr(phalanx.constants, name) == getattr(ray.train.constants, name), name
    assert phalanx.TRAIN_DATASET_KEY == ray_train.TRAIN_DATASET_KEY
