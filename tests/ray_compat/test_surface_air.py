"""Surface parity for the AIR-era names phalanx keeps (Predictors, BatchPredictor,
Preprocessors, framework checkpoints, GBDT trainers with ``datasets`` + ``label_column`` +
``params``).

Ray 2.60 no longer ships most of these, so the expected signatures are written down here as
data, taken from Ray's documentation of the AIR era (Ray 2.4-2.6; the page of each is cited).
A phalanx signature is compatible when every Ray parameter is there, in the same order, of the
same kind (a keyword-only Ray parameter may be keyword-only or not), with the same default; a
parameter Ray requires may have a default in phalanx; phalanx may add parameters after Ray's
positional ones, with defaults. Deliberate differences are listed in ``DOCUMENTED`` with the
reason; they are also in docs/ray_differences.md (section "AIR-era names and data").

NOTE for the lead: 14a's checker (tests/ray_compat/test_surface.py) compares live Ray modules;
this one compares recorded signatures. The two ``compatible`` functions can be unified.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from typing import Any

import pytest

# lightgbm sets KMP_* variables when imported: import it at collection, not inside a test.
with contextlib.suppress(ImportError):
    import lightgbm  # noqa: F401
with contextlib.suppress(ImportError):
    import xgboost  # noqa: F401

REQ = inspect.Parameter.empty  # a parameter Ray requires (no default)
KW = "kw"  # keyword-only in Ray
VAR_KW = "**"  # Ray takes **kwargs
VAR_POS = "*"  # Ray takes *args

DOCS = "https://docs.ray.io/en/releases-2.5.0"

# (phalanx module, qualified name) -> {member: [(name, default, kind?), ...]}.
# ``__init__`` lists the constructor; ``@attr`` lists a class attribute that must exist.
EXPECTED: dict[tuple[str, str], dict[str, list[tuple[Any, ...]]]] = {
    # {DOCS}/train/api/doc/ray.train.predictor.Predictor.html
    ("phalanx.predict", "Predictor"): {
        "__init__": [("preprocessor", None)],
        "from_checkpoint": [("checkpoint", REQ), ("kwargs", None, VAR_KW)],
        "from_pandas_udf": [("pandas_udf", REQ)],
        "get_preprocessor": [],
        "set_preprocessor": [("preprocessor", REQ)],
        "predict": [("data", REQ), ("kwargs", None, VAR_KW)],
        "preferred_batch_format": [],
    },
    # {DOCS}/train/api/doc/ray.train.batch_predictor.BatchPredictor.html
    ("phalanx.predict", "BatchPredictor"): {
        "__init__": [
            ("checkpoint", REQ),
            ("predictor_cls", REQ),
            ("predictor_kwargs", None, VAR_KW),
        ],
        "from_checkpoint": [("checkpoint", REQ), ("predictor_cls", REQ), ("kwargs", None, VAR_KW)],
        "from_pandas_udf": [("pandas_udf", REQ)],
        "get_preprocessor": [],
        "set_preprocessor": [("preprocessor", REQ)],
        "predict": [
            ("data", REQ),
            ("feature_columns", None, KW),
            ("keep_columns", None, KW),
            ("batch_size", 4096, KW),
            ("min_scoring_workers", 1, KW),
            ("max_scoring_workers", None, KW),
            ("num_cpus_per_worker", None, KW),
            ("num_gpus_per_worker", None, KW),
            ("separate_gpu_stage", True, KW),
            ("ray_remote_args", None, KW),
            ("predict_kwargs", None, VAR_KW),
        ],
    },
    # {DOCS}/train/api/doc/ray.train.torch.TorchPredictor.html
    ("phalanx.torch", "TorchPredictor"): {
        "__init__": [("model", REQ), ("preprocessor", None), ("use_gpu", False)],
        "from_checkpoint": [("checkpoint", REQ), ("model", None), ("use_gpu", False)],
        "predict": [("data", REQ), ("dtype", None)],
        "call_model": [("inputs", REQ)],
    },
    # {DOCS}/train/api/doc/ray.train.xgboost.XGBoostPredictor.html
    ("phalanx.xgboost", "XGBoostPredictor"): {
        "__init__": [("model", REQ), ("preprocessor", None)],
        "from_checkpoint": [("checkpoint", REQ)],
        "predict": [
            ("data", REQ),
            ("feature_columns", None),
            ("dmatrix_kwargs", None),
            ("predict_kwargs", None, VAR_KW),
        ],
    },
    # {DOCS}/train/api/doc/ray.train.lightgbm.LightGBMPredictor.html
    ("phalanx.lightgbm", "LightGBMPredictor"): {
        "__init__": [("model", REQ), ("preprocessor", None)],
        "from_checkpoint": [("checkpoint", REQ)],
        "predict": [("data", REQ), ("feature_columns", None), ("predict_kwargs", None, VAR_KW)],
    },
    # {DOCS}/train/api/doc/ray.train.xgboost.XGBoostCheckpoint.html (``path`` since Ray 2.7,
    # https://docs.ray.io/en/latest/train/api/doc/ray.train.xgboost.XGBoostCheckpoint.html)
    ("phalanx.xgboost", "XGBoostCheckpoint"): {
        "from_model": [("booster", REQ), ("preprocessor", None, KW), ("path", None, KW)],
        "get_model": [],
        "get_preprocessor": [],
        "set_preprocessor": [("preprocessor", REQ)],
        "from_checkpoint": [("other", REQ)],
        "@MODEL_FILENAME": [],
    },
    # {DOCS}/train/api/doc/ray.train.lightgbm.LightGBMCheckpoint.html (and latest, as above)
    ("phalanx.lightgbm", "LightGBMCheckpoint"): {
        "from_model": [("booster", REQ), ("preprocessor", None, KW), ("path", None, KW)],
        "get_model": [],
        "get_preprocessor": [],
        "set_preprocessor": [("preprocessor", REQ)],
        "from_checkpoint": [("other", REQ)],
        "@MODEL_FILENAME": [],
    },
    # {DOCS}/train/api/doc/ray.train.torch.TorchCheckpoint.html
    ("phalanx.torch", "TorchCheckpoint"): {
        "from_state_dict": [("state_dict", REQ), ("preprocessor", None, KW)],
        "from_model": [("model", REQ), ("preprocessor", None, KW)],
        "get_model": [("model", None)],
        "get_preprocessor": [],
        "set_preprocessor": [("preprocessor", REQ)],
        "from_checkpoint": [("other", REQ)],
    },
    # {DOCS}/train/api/doc/ray.train.xgboost.XGBoostTrainer.html (GBDTTrainer's arguments)
    ("phalanx.xgboost", "XGBoostTrainer"): {
        "__init__": [
            ("datasets", REQ, KW),
            ("label_column", REQ, KW),
            ("params", REQ, KW),
            ("dmatrix_params", None, KW),
            ("num_boost_round", 10, KW),
            ("scaling_config", None, KW),
            ("run_config", None, KW),
            ("preprocessor", None, KW),
            ("resume_from_checkpoint", None, KW),
            ("metadata", None, KW),
            ("train_kwargs", None, VAR_KW),
        ],
        "fit": [],
        "get_model": [("checkpoint", REQ)],
    },
    # {DOCS}/train/api/doc/ray.train.lightgbm.LightGBMTrainer.html
    ("phalanx.lightgbm", "LightGBMTrainer"): {
        "__init__": [
            ("datasets", REQ, KW),
            ("label_column", REQ, KW),
            ("params", REQ, KW),
            ("dmatrix_params", None, KW),
            ("num_boost_round", 10, KW),
            ("scaling_config", None, KW),
            ("run_config", None, KW),
            ("preprocessor", None, KW),
            ("resume_from_checkpoint", None, KW),
            ("metadata", None, KW),
            ("train_kwargs", None, VAR_KW),
        ],
        "fit": [],
    },
    # {DOCS}/data/api/doc/ray.data.preprocessor.Preprocessor.html
    ("phalanx.preprocess", "Preprocessor"): {
        "fit": [("ds", REQ)],
        "fit_transform": [("ds", REQ)],
        "transform": [("ds", REQ)],
        "transform_batch": [("data", REQ)],
        "fit_status": [],
        "preferred_batch_format": [],
    },
    # {DOCS}/data/api/preprocessor.html (each class's page under data/api/doc/)
    ("phalanx.preprocess", "StandardScaler"): {"__init__": [("columns", REQ)]},
    ("phalanx.preprocess", "MinMaxScaler"): {"__init__": [("columns", REQ)]},
    ("phalanx.preprocess", "SimpleImputer"): {
        "__init__": [("columns", REQ), ("strategy", "mean"), ("fill_value", None)]
    },
    ("phalanx.preprocess", "OrdinalEncoder"): {
        "__init__": [("columns", REQ), ("encode_lists", True, KW)]
    },
    ("phalanx.preprocess", "OneHotEncoder"): {
        "__init__": [("columns", REQ), ("max_categories", None, KW)]
    },
    ("phalanx.preprocess", "LabelEncoder"): {"__init__": [("label_column", REQ)]},
    ("phalanx.preprocess", "Concatenator"): {
        "__init__": [
            ("output_column_name", "concat_out"),
            ("include", None),
            ("exclude", None),
            ("dtype", None),
            ("raise_if_missing", False),
        ]
    },
    ("phalanx.preprocess", "Chain"): {"__init__": [("preprocessors", None, VAR_POS)]},
    ("phalanx.preprocess", "BatchMapper"): {
        "__init__": [("fn", REQ), ("batch_format", REQ), ("batch_size", "default")]
    },
}

# (qualified name, member) -> why phalanx differs, and what to use. Kept short on purpose.
DOCUMENTED: dict[tuple[str, str], str] = {
    ("BatchPredictor", "predict_pipelined"): (
        "DatasetPipeline was removed from Ray Data; predict() streams every shard already."
    ),
    ("Concatenator", "__init__"): (
        "Ray 2.60's columns comes first (positionally); AIR's include/exclude/dtype/"
        "raise_if_missing are keyword arguments, as AIR examples pass them."
    ),
}

# Defaults that differ in spelling but not in meaning.
EQUIVALENT_DEFAULTS = {("num_boost_round", 10): None}  # None means 10, as in Ray 2.60

NOT_IN_AIR_LIST = ["predict_pipelined"]
EXPECTED_MEMBERS = {
    q: set(members) for (_, q), members in EXPECTED.items()
}  # listed for the record: AIR had it, see DOCUMENTED


def _params(obj: Any) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    return [p for p in params if p.name not in ("self", "cls")]


def _lacks_var(actual: list[inspect.Parameter], name: str, kind: str) -> list[str]:
    wanted = inspect.Parameter.VAR_KEYWORD if kind == VAR_KW else inspect.Parameter.VAR_POSITIONAL
    return [] if any(p.kind == wanted for p in actual) else [f"takes no {kind}{name}"]


def compatible(expected: list[tuple[Any, ...]], obj: Any) -> list[str]:
    """What makes ``obj``'s signature incompatible with ``expected`` (empty: compatible)."""
    actual = _params(obj)
    by_name = {p.name: (i, p) for i, p in enumerate(actual)}
    problems, last = [], -1
    for entry in expected:
        name, default, kind = (*entry, None)[:3]
        if kind in (VAR_KW, VAR_POS):
            problems += _lacks_var(actual, name, kind)
            continue
        if name not in by_name:
            problems.append(f"lacks parameter {name!r}")
            continue
        index, param = by_name[name]
        if kind != KW:  # positional in Ray: the order is part of the API
            if index < last:
                problems.append(f"{name!r} is out of Ray's order")
            last = max(last, index)
        if kind != KW and param.kind == inspect.Parameter.KEYWORD_ONLY:
            problems.append(f"{name!r} is keyword-only; Ray takes it positionally")
        equivalent = EQUIVALENT_DEFAULTS.get((name, default), default)
        if default is not REQ and param.default not in (default, equivalent):
            problems.append(f"{name!r} defaults to {param.default!r}, Ray's to {default!r}")
    names = {e[0] for e in expected}
    for param in actual:
        extra = param.name not in names and param.kind not in (
            inspect.Parameter.VAR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        )
        if extra and param.default is inspect.Parameter.empty:
            problems.append(f"adds required parameter {param.name!r}")
    return problems


def _cases() -> list[tuple[str, str, str, list[tuple[Any, ...]]]]:
    return [
        (module, qualname, member, params)
        for (module, qualname), members in EXPECTED.items()
        for member, params in members.items()
    ]


@pytest.mark.parametrize(
    ("module", "qualname", "member", "params"),
    _cases(),
    ids=[f"{q}.{m}" for _, q, m, _ in _cases()],
)
def test_air_signature_is_compatible(module, qualname, member, params):
    if module in ("phalanx.xgboost", "phalanx.lightgbm", "phalanx.torch"):
        pytest.importorskip(module.split(".")[1])
    cls = getattr(importlib.import_module(module), qualname)
    if member.startswith("@"):
        assert hasattr(cls, member[1:]), f"{qualname} lacks {member[1:]}"
        return
    assert hasattr(cls, member), f"{qualname}.{member} is missing"
    problems = compatible(params, getattr(cls, member))
    reason = DOCUMENTED.get((qualname, member))
    if reason is None:
        assert not problems, f"{module}.{qualname}.{member}: {problems}"
    else:
        # A documented difference must still be a real one, or the entry is stale.
        assert problems, f"{qualname}.{member} is documented as different but matches Ray"


def test_documented_differences_name_real_members_or_gaps():
    for (qualname, member), reason in DOCUMENTED.items():
        assert reason.strip()
        assert any(q == qualname for (_, q) in EXPECTED), qualname
        assert member in EXPECTED_MEMBERS[qualname] or member in NOT_IN_AIR_LIST, member


def test_counts_are_what_the_note_says():
    """matched / documented / missing (the note on issue 14 gives these numbers)."""
    matched = documented = missing = 0
    for module, qualname, member, params in _cases():
        try:
            cls = getattr(importlib.import_module(module), qualname)
        except ImportError:
            continue
        ok = hasattr(cls, member.lstrip("@")) and (
            member.startswith("@") or not compatible(params, getattr(cls, member))
        )
        if (qualname, member) in DOCUMENTED:
            documented += 1
        elif ok:
            matched += 1
        else:
            missing += 1
    documented += sum(1 for (_, m) in DOCUMENTED if m in NOT_IN_AIR_LIST)
    assert (matched, documented, missing) == (60, 2, 0)
