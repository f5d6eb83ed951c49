"""The rewrite table of ``phalanx migrate``: which Ray name becomes which phalanx name.

Data only; :mod:`phalanx.migrate._codemod` applies it. Three kinds of rows:

- ``MODULES``: a Ray module whose public names exist under the same name in a phalanx module
  (``ray.train.torch`` -> ``phalanx.torch``). ``ray.train.torch.torch_trainer`` and any other
  submodule of a row map to the row's target too (Ray re-exports those names at the top). A
  name the phalanx module's ``__all__`` lacks (``ray.data.preprocessors.Tokenizer``) is left
  as it is and listed.
- ``NAMES``: one Ray name -> one phalanx expression, for modules phalanx covers in part
  (``ray.data``, ``ray.air``) or where the name moved (``ray.air.session.get_world_rank`` ->
  ``phalanx.session.get_context().get_world_rank``). A name of such a module that has no row is
  left as it is and listed for the user, with ``UNSUPPORTED``'s advice.
- ``UNSUPPORTED``: Ray modules with no phalanx equivalent, and what to do instead.

``tests/migrate/test_migrate_table.py`` imports every target, so the table cannot name what phalanx
lacks.
"""

from __future__ import annotations

__all__ = [
    "DEPRECATED",
    "MODULES",
    "NAMES",
    "PARTIAL",
    "UNSUPPORTED",
    "lookup_module",
    "rule_count",
]

MODULES: dict[str, str] = {
    # Ray Train 2.60 (V2) and its AIR-era paths.
    "ray.train": "phalanx",
    "ray.train.base_trainer": "phalanx",
    "ray.train.data_parallel_trainer": "phalanx",
    "ray.train.trainer": "phalanx",
    "ray.train.context": "phalanx",
    "ray.train.constants": "phalanx.constants",
    "ray.train.collective": "phalanx.collective",
    "ray.train.torch": "phalanx.torch",
    "ray.train.xgboost": "phalanx.xgboost",
    "ray.train.lightgbm": "phalanx.lightgbm",
    "ray.train.lightning": "phalanx.lightning",
    "ray.train.tensorflow": "phalanx.tensorflow",
    "ray.train.tensorflow.keras": "phalanx.tensorflow.keras",
    "ray.train.huggingface": "phalanx.huggingface",
    "ray.train.huggingface.transformers": "phalanx.huggingface.transformers",
    "ray.train.horovod": "phalanx.horovod",
    "ray.train.sklearn": "phalanx.sklearn",
    "ray.train.predictor": "phalanx.predict",
    "ray.train.batch_predictor": "phalanx.predict",
    # The V2 paths Ray's own code and some examples import from.
    "ray.train.v2.api": "phalanx",
    "ray.train.v2.torch": "phalanx.torch",
    "ray.train.v2.xgboost": "phalanx.xgboost",
    "ray.train.v2.lightgbm": "phalanx.lightgbm",
    "ray.train.v2.lightning": "phalanx.lightning",
    "ray.train.v2.tensorflow": "phalanx.tensorflow",
    "ray.train.v2.huggingface": "phalanx.huggingface",
    "ray.train.v2.huggingface.transformers": "phalanx.huggingface.transformers",
    "ray.train.v2.jax": "phalanx.jax",
    # AIR (Ray 2.4-2.6).
    "ray.air.config": "phalanx",
    "ray.air.checkpoint": "phalanx",
    "ray.air.result": "phalanx",
    "ray.air.integrations.mlflow": "phalanx.integrations.mlflow",
    "ray.air.integrations.wandb": "phalanx.integrations.wandb",
    "ray.air.integrations.keras": "phalanx.tensorflow.keras",
    "ray.data.preprocessors": "phalanx.preprocess",
    # Tune's logger callbacks, which Ray Train's RunConfig(callbacks=...) takes.
    "ray.tune.logger": "phalanx.integrations.logger",
    # Ray Tune's sweeps over Train runs (a name phalanx.tune lacks is listed, with _TUNE).
    "ray.tune": "phalanx.tune",
    "ray.tune.tuner": "phalanx.tune",
    "ray.tune.tune_config": "phalanx.tune",
    "ray.tune.result_grid": "phalanx.tune",
    "ray.tune.search": "phalanx.tune.search",
    "ray.tune.search.optuna": "phalanx.tune.search.optuna",
    "ray.tune.schedulers": "phalanx.tune.schedulers",
    "ray.tune.integration.ray_train": "phalanx.tune.integration.ray_train",
}

# Modules phalanx covers in part: only the names in NAMES are rewritten.
PARTIAL: dict[str, str] = {
    "ray.air": "phalanx",
    "ray.air.session": "phalanx.session",
    "ray.air.constants": "phalanx.constants",
    "ray.data": "phalanx.data",
}

_SESSION = "phalanx.session"
_CONTEXT = f"{_SESSION}.get_context()"

NAMES: dict[str, str] = {
    **{
        f"ray.air.{name}": f"phalanx.{name}"
        for name in (
            "Checkpoint",
            "CheckpointConfig",
            "FailureConfig",
            "Result",
            "RunConfig",
            "ScalingConfig",
        )
    },
    "ray.air.session": "phalanx.session",
    "ray.air.constants.TRAIN_DATASET_KEY": "phalanx.constants.TRAIN_DATASET_KEY",
    # Ray 2.4's name; Ray 2.5 renamed it, same parameters.
    "ray.train.huggingface.HuggingFaceTrainer": "phalanx.huggingface.TransformersTrainer",
    # ray.air.session's functions: the V2 API reads them from the train context.
    **{
        f"ray.air.session.{name}": f"{_SESSION}.{name}"
        for name in ("report", "get_checkpoint", "get_dataset_shard")
    },
    **{
        f"ray.air.session.{name}": f"{_CONTEXT}.{name}"
        for name in (
            "get_world_rank",
            "get_world_size",
            "get_local_rank",
            "get_local_world_size",
            "get_node_rank",
            "get_experiment_name",
            "get_metadata",
            "get_storage",
        )
    },
    # ray.data: what phalanx.data has (a phalanx Dataset is sharded, streamed and read by the
    # workers without Ray).
    **{
        f"ray.data.{name}": f"phalanx.data.{name}"
        for name in (
            "Dataset",
            "DataIterator",
            "ExecutionOptions",
            "ExecutionResources",
            "from_arrow",
            "from_items",
            "from_numpy",
            "from_pandas",
            "read_csv",
            "read_json",
            "read_parquet",
        )
    },
}

_TUNE = (
    "phalanx.tune has no {name} (it has Tuner, TuneConfig, the search spaces, "
    "BasicVariantGenerator, OptunaSearch, ASHA, MedianStoppingRule, PBT and FIFO): keep this "
    "part on Ray Tune (class Trainables, tune.run, Tune's other searchers and schedulers), or "
    "see docs/guides/sweeps.md"
)
_DATA = (
    "phalanx.data has no {name}: build the dataset with phalanx.data.from_items / from_pandas / "
    "from_numpy / read_parquet / read_csv / read_json, or keep Ray Data (with Ray running, "
    "phalanx's datasets= takes a ray.data.Dataset)"
)

# Ray module -> what to do, for what the table does not rewrite.
UNSUPPORTED: dict[str, str] = {
    "ray.tune": _TUNE,
    "ray.air.session": (
        "{name} is a Ray Tune trial property with no phalanx equivalent: use "
        "phalanx.get_context().get_experiment_name() or get_storage()"
    ),
    "ray.air": "{name} has no phalanx equivalent: see docs/ray_differences.md",
    "ray.data": _DATA,
    "ray.serve": (
        "phalanx.serve covers serving a phalanx checkpoint (`phalanx serve`, "
        "phalanx.serve.deployment); other Ray Serve code stays on Ray Serve"
    ),
    "ray.train": "{name} has no phalanx equivalent: see docs/ray_differences.md",
    "ray.rllib": "RLlib has no phalanx equivalent: keep it on Ray",
}


# AIR's framework trainers: rewritten to phalanx's (they run as written), with a note. Their
# body cannot be turned into a TorchTrainer loop mechanically (the user's init function is the
# loop's middle), so the note points at the form the DeprecationWarning shows.
_AIR_TRAINER = (
    "{name} is AIR's {framework} trainer API (removed from Ray since): it runs as written "
    "and warns (DeprecationWarning) with the two-line TorchTrainer form to move to; see "
    "docs/guides/frameworks/{page}.md"
)
DEPRECATED: dict[str, str] = {
    "phalanx.huggingface.TransformersTrainer": _AIR_TRAINER.format(
        name="TransformersTrainer", framework="Transformers", page="huggingface"
    ),
    "phalanx.huggingface.AccelerateTrainer": _AIR_TRAINER.format(
        name="AccelerateTrainer", framework="Accelerate", page="huggingface"
    ),
    "phalanx.lightning.LightningTrainer": _AIR_TRAINER.format(
        name="LightningTrainer", framework="Lightning", page="lightning"
    ),
    "phalanx.lightning.LightningConfigBuilder": _AIR_TRAINER.format(
        name="LightningConfigBuilder", framework="Lightning", page="lightning"
    ),
}


def lookup_module(dotted: str) -> str | None:
    """The phalanx module for a Ray module path (or a submodule of a ``MODULES`` row), else None."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        target = MODULES.get(".".join(parts[:end]))
        if target is not None:
            return target
    return None


def rule_count() -> int:
    """How many rewrite rules the table holds (module rows and name rows)."""
    return len(MODULES) + len(NAMES)
