"""Every rewrite rule of ``phalanx migrate``, on source text (no processes, no files).

Each case is Ray code as Ray's docs write it and the phalanx code it must become; every case is
also run a second time to check that the migration is idempotent.
"""

from __future__ import annotations

import textwrap

import pytest

from phalanx.migrate import migrate_source

CASES: dict[str, tuple[str, str]] = {
    "import ray, ray.train.report": (
        """
        import ray
        import ray.train

        def f(config):
            ray.train.report({"loss": 1.0})
            rank = ray.train.get_context().get_world_rank()
        """,
        """
        import phalanx

        def f(config):
            phalanx.report({"loss": 1.0})
            rank = phalanx.get_context().get_world_rank()
        """,
    ),
    "import ray.train as train": (
        """
        import ray.train as train
        train.report({})
        """,
        """
        import phalanx as train
        train.report({})
        """,
    ),
    "from ray import train": (
        """
        from ray import train
        from ray import train as t
        train.report({})
        t.get_checkpoint()
        """,
        """
        import phalanx as train
        import phalanx as t
        train.report({})
        t.get_checkpoint()
        """,
    ),
    "from ray.train.torch import ..., layout kept": (
        """
        from ray.train.torch import (  # the torch parts
            TorchTrainer,
            prepare_model,  # wraps DDP
        )
        from ray.train import Checkpoint as Ckpt, ScalingConfig
        """,
        """
        from phalanx.torch import (  # the torch parts
            TorchTrainer,
            prepare_model,  # wraps DDP
        )
        from phalanx import Checkpoint as Ckpt, ScalingConfig
        """,
    ),
    "import ray.train.torch as alias": (
        """
        import ray.train.torch as rtt
        model = rtt.prepare_model(model)
        """,
        """
        import phalanx.torch as rtt
        model = rtt.prepare_model(model)
        """,
    ),
    "ray.train.torch.X attributes": (
        """
        import ray.train.torch

        trainer = ray.train.torch.TorchTrainer(f, scaling_config=ray.train.ScalingConfig(num_workers=2))
        """,
        """
        import phalanx
        import phalanx.torch

        trainer = phalanx.torch.TorchTrainer(f, scaling_config=phalanx.ScalingConfig(num_workers=2))
        """,
    ),
    "frameworks and helpers": (
        """
        from ray.train.xgboost import XGBoostTrainer, RayTrainReportCallback
        from ray.train.lightgbm import LightGBMTrainer
        from ray.train.lightning import RayDDPStrategy, prepare_trainer
        from ray.train.tensorflow import TensorflowTrainer
        from ray.train.tensorflow.keras import ReportCheckpointCallback
        from ray.train.huggingface.transformers import prepare_trainer as hf_prepare
        from ray.train.collective import barrier
        from ray.train.constants import TRAIN_DATASET_KEY
        """,
        """
        from phalanx.xgboost import XGBoostTrainer, RayTrainReportCallback
        from phalanx.lightgbm import LightGBMTrainer
        from phalanx.lightning import RayDDPStrategy, prepare_trainer
        from phalanx.tensorflow import TensorflowTrainer
        from phalanx.tensorflow.keras import ReportCheckpointCallback
        from phalanx.huggingface.transformers import prepare_trainer as hf_prepare
        from phalanx.collective import barrier
        from phalanx.constants import TRAIN_DATASET_KEY
        """,
    ),
    "ray.train.v2 paths": (
        """
        from ray.train.v2.jax import JaxTrainer
        from ray.train.v2.api.config import ScalingConfig
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
        from ray.train.v2.torch.torch_trainer import TorchTrainer
        """,
        """
        from phalanx.jax import JaxTrainer
        from phalanx import ScalingConfig
        from phalanx import DataParallelTrainer
        from phalanx.torch import TorchTrainer
        """,
    ),
    "AIR-era module paths": (
        """
        from ray.train.data_parallel_trainer import DataParallelTrainer
        from ray.train.base_trainer import BaseTrainer
        from ray.train.torch.torch_checkpoint import TorchCheckpoint
        from ray.air.config import ScalingConfig, RunConfig
        from ray.air.result import Result
        from ray.train.batch_predictor import BatchPredictor
        from ray.data.preprocessors import StandardScaler
        from ray.air.integrations.mlflow import MLflowLoggerCallback
        """,
        """
        from phalanx import DataParallelTrainer
        from phalanx import BaseTrainer
        from phalanx.torch import TorchCheckpoint
        from phalanx import ScalingConfig, RunConfig
        from phalanx import Result
        from phalanx.predict import BatchPredictor
        from phalanx.preprocess import StandardScaler
        from phalanx.integrations.mlflow import MLflowLoggerCallback
        """,
    ),
    "AIR-era renames and Tune's logger callbacks": (
        """
        from ray.train.huggingface import HuggingFaceTrainer
        from ray.tune.logger import CSVLoggerCallback
        """,
        """
        from phalanx.huggingface import TransformersTrainer as HuggingFaceTrainer
        from phalanx.integrations.logger import CSVLoggerCallback
        """,
    ),
    "ray.air session": (
        """
        from ray.air import session, Checkpoint, ScalingConfig

        def f(config):
            rank = session.get_world_rank()
            size = session.get_world_size()
            shard = session.get_dataset_shard("train")
            session.report({"rank": rank}, checkpoint=Checkpoint.from_directory("."))
        """,
        """
        from phalanx import session, Checkpoint, ScalingConfig

        def f(config):
            rank = session.get_context().get_world_rank()
            size = session.get_context().get_world_size()
            shard = session.get_dataset_shard("train")
            session.report({"rank": rank}, checkpoint=Checkpoint.from_directory("."))
        """,
    ),
    "import ray.air and ray.air.session attributes": (
        """
        import ray.air
        import ray.train.torch

        def f(config):
            ray.air.session.report({"r": ray.air.session.get_local_rank()})

        trainer = ray.train.torch.TorchTrainer(f, scaling_config=ray.air.ScalingConfig(num_workers=2))
        """,
        """
        import phalanx
        import phalanx.session
        import phalanx.torch

        def f(config):
            phalanx.session.report({"r": phalanx.session.get_context().get_local_rank()})

        trainer = phalanx.torch.TorchTrainer(f, scaling_config=phalanx.ScalingConfig(num_workers=2))
        """,
    ),
    "ray.data functions phalanx has": (
        """
        import ray

        ds = ray.data.from_items([{"x": 1}])
        df_ds = ray.data.from_pandas(df)
        pq = ray.data.read_parquet("data/")
        """,
        """
        import phalanx.data

        ds = phalanx.data.from_items([{"x": 1}])
        df_ds = phalanx.data.from_pandas(df)
        pq = phalanx.data.read_parquet("data/")
        """,
    ),
    "ray.init() and ray.shutdown() removed when Ray is unused": (
        """
        import ray
        from ray.train.torch import TorchTrainer


        def main():
            TorchTrainer(f).fit()


        if __name__ == "__main__":
            ray.init()
            main()
            ray.shutdown()
        if not_needed:
            ray.init()
        """,
        """
        from phalanx.torch import TorchTrainer


        def main():
            TorchTrainer(f).fit()


        if __name__ == "__main__":
            main()
        if not_needed:
            pass
        """,
    ),
    "Ray Core kept with import ray and ray.init": (
        """
        import ray
        import ray.train

        ray.init()

        @ray.remote
        def square(x):
            return x * x

        def f(config):
            ray.train.report({"sq": config["sq"]})
        ray.get(square.remote(2))
        """,
        """
        import ray
        import phalanx

        ray.init()

        @ray.remote
        def square(x):
            return x * x

        def f(config):
            phalanx.report({"sq": config["sq"]})
        ray.get(square.remote(2))
        """,
    ),
    "ray.init(address=...) connects to a cluster: kept": (
        """
        import ray
        import ray.train

        ray.init(address="auto")
        ray.train.report({})
        """,
        """
        import ray
        import phalanx

        ray.init(address="auto")
        phalanx.report({})
        """,
    ),
    "import ray.train binds ray; Ray Core still needs import ray": (
        """
        import ray.train
        ray.train.report({})
        ray.get(ref)
        """,
        """
        import phalanx
        import ray
        phalanx.report({})
        ray.get(ref)
        """,
    ),
    "existing import phalanx is not duplicated": (
        """
        import phalanx
        import ray

        phalanx.get_context()
        ray.train.report({})
        """,
        """
        import phalanx

        phalanx.get_context()
        phalanx.report({})
        """,
    ),
    "strings, comments and other names untouched": (
        """
        import ray.train
        # ray.train.report is called below
        doc = "ray.train.report(...)"
        self.ray.train = 1
        f(ray=1)
        ray.train.report({})
        """,
        """
        import phalanx
        # ray.train.report is called below
        doc = "ray.train.report(...)"
        self.ray.train = 1
        f(ray=1)
        phalanx.report({})
        """,
    ),
    "star import of a whole module": (
        """
        from ray.train import *
        report({})
        """,
        """
        from phalanx import *
        report({})
        """,
    ),
    "comments above a removed line stay": (
        """
        import ray
        from ray.train import RunConfig

        # Start Ray.
        ray.init()

        # Train.
        RunConfig()
        """,
        """
        from phalanx import RunConfig

        # Start Ray.

        # Train.
        RunConfig()
        """,
    ),
    "a moved function imported by name": (
        """
        from ray.air.session import get_world_rank, report
        report({"rank": get_world_rank()})
        """,
        """
        from phalanx.session import report
        import phalanx.session
        report({"rank": phalanx.session.get_context().get_world_rank()})
        """,
    ),
    "a parameter or definition named like an import is no use of it": (
        """
        from ray.train import Checkpoint
        import ray.train

        def load(Checkpoint, train=ray.train.get_checkpoint()):
            return Checkpoint
        """,
        """
        from phalanx import Checkpoint
        import phalanx

        def load(Checkpoint, train=phalanx.get_checkpoint()):
            return Checkpoint
        """,
    ),
    "new imports go to module level when a Ray import is there": (
        """
        def train_func():
            import ray.train
            ray.train.report({})

        import ray.train.torch
        trainer = ray.train.torch.TorchTrainer(train_func)
        """,
        """
        def train_func():
            phalanx.report({})

        import phalanx
        import phalanx.torch
        trainer = phalanx.torch.TorchTrainer(train_func)
        """,
    ),
    "an import inside the function only": (
        """
        def train_func():
            import ray.train
            ray.train.report({})
        """,
        """
        def train_func():
            import phalanx
            phalanx.report({})
        """,
    ),
    "semicolons and a docstring": (
        '''
        """My script."""
        from __future__ import annotations
        import os; import ray.train
        ray.train.report({})
        ''',
        '''
        """My script."""
        from __future__ import annotations
        import os; import phalanx
        phalanx.report({})
        ''',
    ),
}


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


@pytest.mark.parametrize("case", CASES)
def test_rule(case: str) -> None:
    ray_code, phalanx_code = CASES[case]
    migrated = migrate_source(_src(ray_code))
    assert migrated.code == _src(phalanx_code)
    assert migrated.attention == ()
    again = migrate_source(migrated.code)
    assert again.code == migrated.code, "a second run must change nothing"


def test_removing_ray_init_says_so() -> None:
    migrated = migrate_source(
        _src(CASES["ray.init() and ray.shutdown() removed when Ray is unused"][0])
    )
    assert [note.split(":")[0] for note in migrated.notes] == ["10", "12", "14"]
    assert "ray.init(address=...)" in migrated.notes[0]


def test_airs_framework_trainers_are_rewritten_with_a_note_once_each() -> None:
    source = _src(
        """
        from ray.train.lightning import LightningTrainer, LightningConfigBuilder
        import ray.train.huggingface

        config = LightningConfigBuilder().build()
        trainer = LightningTrainer(lightning_config=config)
        other = ray.train.huggingface.AccelerateTrainer(f, accelerate_config={})
        """
    )
    migrated = migrate_source(source)
    assert "from phalanx.lightning import LightningTrainer, LightningConfigBuilder" in (
        migrated.code
    )
    assert "phalanx.huggingface.AccelerateTrainer(f" in migrated.code
    notes = {note.split(": ")[1].split(" ")[0]: note.split(":")[0] for note in migrated.notes}
    assert notes == {
        "LightningConfigBuilder": "1",
        "LightningTrainer": "1",
        "AccelerateTrainer": "6",
    }
    assert all("DeprecationWarning" in note for note in migrated.notes)
    assert not migrated.attention


ATTENTION: dict[str, tuple[str, list[tuple[int, str]]]] = {
    "Ray Tune's names phalanx.tune lacks": (
        """
        from ray import tune
        from ray.tune.search.hyperopt import HyperOptSearch
        analysis = tune.run(f, search_alg=HyperOptSearch())
        """,
        [
            (2, "ray.tune.search.hyperopt.HyperOptSearch"),
            (3, "ray.tune.run"),
            (3, "ray.tune.search.hyperopt.HyperOptSearch"),
        ],
    ),
    "ray.data functions phalanx lacks": (
        """
        import ray
        ds = ray.data.range(10)
        images = ray.data.read_images("s3://bucket/")
        """,
        [(2, "ray.data.range"), (3, "ray.data.read_images")],
    ),
    "ray.serve": (
        """
        from ray import serve
        serve.run(app)
        """,
        [(1, "ray.serve"), (2, "ray.serve.run")],
    ),
    "Tune trial properties of ray.air.session": (
        """
        from ray.air import session
        name = session.get_trial_name()
        session.report({})
        """,
        [(2, "ray.air.session.get_trial_name")],
    ),
    "star import of a module phalanx covers in part": (
        """
        from ray.air import *
        from ray.data import *
        """,
        [(1, "ray.air.*"), (2, "ray.data.*")],
    ),
    "names phalanx lacks in a covered module": (
        """
        from ray.air.config import DatasetConfig, ScalingConfig
        from ray.data.preprocessors import Tokenizer
        """,
        [(1, "ray.air.config.DatasetConfig"), (2, "ray.data.preprocessors.Tokenizer")],
    ),
}


@pytest.mark.parametrize("case", ATTENTION)
def test_what_has_no_equivalent_is_left_and_listed(case: str) -> None:
    ray_code, expected = ATTENTION[case]
    migrated = migrate_source(_src(ray_code))
    assert [(item.line, item.name) for item in migrated.attention] == expected
    assert all(item.advice for item in migrated.attention)
    assert migrate_source(migrated.code).code == migrated.code


def test_partly_covered_names_split_the_import() -> None:
    migrated = migrate_source(_src("from ray.air.config import DatasetConfig, ScalingConfig\n"))
    assert migrated.code == (
        "from phalanx import ScalingConfig\nfrom ray.air.config import DatasetConfig\n"
    )


def test_kept_ray_data_keeps_ray_and_the_rest_moves() -> None:
    migrated = migrate_source(
        _src(
            """
            import ray
            import ray.data
            import ray.train
            ray.init()
            a = ray.data.range(4)
            b = ray.data.from_items([1])
            ray.train.report({})
            """
        )
    )
    assert migrated.code == _src(
        """
        import ray
        import phalanx
        import phalanx.data
        import ray.data
        ray.init()
        a = ray.data.range(4)
        b = phalanx.data.from_items([1])
        phalanx.report({})
        """
    )


def test_an_alias_with_an_unsupported_use_stays_on_ray() -> None:
    migrated = migrate_source(
        _src(
            """
            import ray.data as rd
            a = rd.range(4)
            b = rd.from_items([1])
            """
        )
    )
    assert migrated.code == _src(
        """
        import ray.data as rd
        import phalanx.data
        a = rd.range(4)
        b = phalanx.data.from_items([1])
        """
    )
    assert [item.name for item in migrated.attention] == ["ray.data.range"]
