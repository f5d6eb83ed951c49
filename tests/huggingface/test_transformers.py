"""phalanx.huggingface.transformers: Ray's "Get started with Hugging Face Transformers" flow with
the imports changed, on real worker processes (2 ranks, gloo), a tiny BERT built from a config
and saved/loaded with ``save_pretrained``/``from_pretrained``, synthetic token data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

# Imported here so the workers, forked from this process, start with them loaded (seconds each).
from _helpers.hf_tiny import tiny_bert_config, token_data
from transformers import (
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from phalanx.torch import TorchTrainer

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


# -- imports --------------------------------------------------------------------------------------


def test_import_phalanx_leaves_transformers_unimported():
    done = _python(
        "import sys, phalanx, phalanx.huggingface\n"
        "assert 'transformers' not in sys.modules and 'accelerate' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('transformers', 'accelerate')))"
    )
    assert done.returncode == 0, done.stderr


def test_missing_transformers_names_the_extra():
    done = _python(
        "import sys; sys.modules['transformers'] = None\nimport phalanx.huggingface.transformers"
    )
    assert done.returncode != 0
    # MissingDependencyError, a ModuleNotFoundError: `except ImportError` still catches it.
    assert "MissingDependencyError" in done.stderr
    assert 'pip install "phalanx[transformers]"' in done.stderr


# -- prepare_trainer, in this process -------------------------------------------------------------


def _trainer(tmp_path, **datasets) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=4, use_cpu=True, report_to="none"
    )
    return Trainer(model=BertForSequenceClassification(tiny_bert_config()), args=args, **datasets)


def test_prepare_trainer_reads_a_shard_again_every_epoch(tmp_path):
    shard = phalanx.data.from_numpy(token_data(24)).iterator()
    evals = {"a": shard.iter_torch_batches(batch_size=6, device="cpu")}
    trainer = _trainer(
        tmp_path,
        train_dataset=shard.iter_torch_batches(batch_size=8, device="cpu"),
        eval_dataset=evals,
    )
    assert prepare_trainer(trainer) is trainer and isinstance(trainer, Trainer)
    first, second = (list(trainer.get_train_dataloader()) for _ in range(2))
    assert [len(b["labels"]) for b in first] == [8, 8, 8]  # batches handed over as they are
    labels = np.concatenate([b["labels"].numpy() for b in second])
    assert np.array_equal(labels, token_data(24)["labels"])  # the second epoch has every row
    assert sum(len(b["labels"]) for b in trainer.get_eval_dataloader("a")) == 24
    assert sum(len(b["labels"]) for b in trainer.get_test_dataloader(evals["a"])) == 24


def test_prepare_trainer_refuses_a_one_pass_iterator(tmp_path):
    shard = phalanx.data.from_numpy(token_data(8)).iterator()
    trainer = _trainer(tmp_path, train_dataset=iter(shard.iter_torch_batches(batch_size=4)))
    with pytest.raises(TypeError, match=r"one-pass iterator(.|\n)*HINT"):
        prepare_trainer(trainer)
    with pytest.raises(TypeError, match=r"transformers\.Trainer"):
        prepare_trainer(object())  # type: ignore[arg-type]


# -- the guide's flow on 2 workers ----------------------------------------------------------------

STEPS, SAVE_EVERY = 12, 4


class _KillRank1(TrainerCallback):
    """Rank 1 dies (SIGKILL, as an OOM kill does) mid-training in the first attempt."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        ctx = phalanx.get_context()
        if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1 and state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def _guide_train_func(config):
    # What Ray's guide writes, with phalanx's imports.
    model = AutoModelForSequenceClassification.from_pretrained(config["model_dir"])
    train_ds = phalanx.get_dataset_shard("train").iter_torch_batches(batch_size=8)
    eval_ds = phalanx.get_dataset_shard("evaluation").iter_torch_batches(batch_size=8)
    args = TrainingArguments(
        output_dir=config["output_dir"],
        max_steps=STEPS,
        eval_strategy="steps",
        eval_steps=SAVE_EVERY,
        save_strategy="steps",
        save_steps=SAVE_EVERY,
        save_total_limit=2,
        logging_steps=2,
        learning_rate=5e-3,
        report_to="none",
        disable_tqdm=True,  # no use_cpu=True: phalanx's CPU workers say so, as accelerate launch does
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds)
    trainer.add_callback(RayTrainReportCallback())
    trainer.add_callback(_KillRank1(config["kill_at"]))
    trainer = prepare_trainer(trainer)
    checkpoint = phalanx.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=path)
    else:
        trainer.train()


@pytest.mark.slow
def test_guide_flow_checkpoints_survive_a_killed_worker_and_predict(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the Hub
    model_dir = str(tmp_path / "base")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).save_pretrained(model_dir)
    output_dir = tmp_path / "hf_output"
    result = TorchTrainer(
        _guide_train_func,
        train_loop_config={
            "model_dir": model_dir,
            "output_dir": str(output_dir),
            "kill_at": SAVE_EVERY + 2,
        },
        scaling_config=ScalingConfig(num_workers=2),
        datasets={
            "train": phalanx.data.from_numpy(token_data(64)),
            "evaluation": phalanx.data.from_numpy(token_data(32, seed=1)),
        },
        run_config=RunConfig(
            name="hf",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="eval_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()

    assert result.error is None and result.attempts == 2
    # Every save was reported once, and the retry resumed HF's own step count from step 4
    # (a restart from scratch would report step 4 twice).
    history = result.metrics_dataframe
    assert history["step"].tolist() == [4, 8, 12]
    assert history["eval_loss"].notna().all() and history["loss"].notna().all()
    assert result.metrics["step"] == STEPS and "eval_loss" in result.metrics

    # HF's own folder is HF's: save_total_limit rotated it, and what it kept is whole.
    assert sorted(os.listdir(output_dir)) == ["checkpoint-12", "checkpoint-8"]
    for kept in os.listdir(output_dir):
        names = set(os.listdir(output_dir / kept))
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= names, names

    # The committed checkpoints hold HF's folder under checkpoint/, with both ranks' RNG state.
    assert len(result.best_checkpoints) == 2
    for checkpoint, metrics in result.best_checkpoints:
        hf_dir = os.path.join(checkpoint.path, RayTrainReportCallback.CHECKPOINT_NAME)
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(hf_dir))
        with open(os.path.join(hf_dir, "trainer_state.json")) as f:
            assert json.load(f)["global_step"] == metrics["step"]

    best = result.get_best_checkpoint(metric="eval_loss", mode="min")
    kept_losses = {c.path: m["eval_loss"] for c, m in result.best_checkpoints}
    assert best is not None and kept_losses[best.path] == min(kept_losses.values())
    with best.as_directory() as d:
        model = AutoModelForSequenceClassification.from_pretrained(
            os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        )
    data = token_data(16, seed=2)
    with torch.no_grad():
        logits = model(
            input_ids=torch.as_tensor(data["input_ids"]),
            attention_mask=torch.as_tensor(data["attention_mask"]),
        ).logits
    assert logits.shape == (16, 2) and torch.isfinite(logits).all()


def _folders_train_func(config):
    rank = phalanx.get_context().get_world_rank()
    # Record, in this worker only, whether this rank passed a checkpoint (the callback calls
    # phalanx.session.report).
    report = phalanx.session.report

    def recording_report(metrics, checkpoint=None, **kwargs):
        report({**metrics, "passed": checkpoint is not None}, checkpoint=checkpoint, **kwargs)

    phalanx.session.report = recording_report
    args = TrainingArguments(
        output_dir=os.path.join(config["output_dir"], "" if config["shared"] else f"rank{rank}"),
        max_steps=4,
        save_strategy="steps",
        save_steps=4,
        report_to="none",
        disable_tqdm=True,
    )
    data = phalanx.get_dataset_shard("train").iter_torch_batches(batch_size=8)
    model = BertForSequenceClassification(tiny_bert_config())
    trainer = prepare_trainer(Trainer(model=model, args=args, train_dataset=data))
    trainer.add_callback(RayTrainReportCallback())
    trainer.train()


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False], ids=["one-folder", "folder-per-rank"])
def test_a_folder_is_reported_once_by_the_ranks_sharing_it(tmp_path, shared):
    output_dir = tmp_path / "hf_output"
    result = TorchTrainer(
        _folders_train_func,
        train_loop_config={"output_dir": str(output_dir), "shared": shared},
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": phalanx.data.from_numpy(token_data(32))},
        run_config=RunConfig(name="parts", storage_path=str(tmp_path / "runs")),
    ).fit()
    passed = dict(zip(*result.all_ranks_metrics_dataframe[["rank", "passed"]].T.values))
    # One folder: rank 0 reports it once every rank has saved into it (rank 1's RNG state
    # included). A folder per rank (as on separate nodes): each reports its own part.
    assert passed == {0: True, 1: not shared}
    if not shared:  # HF writes the model on rank 0 only; every rank writes its RNG state
        assert os.listdir(output_dir / "rank1" / "checkpoint-4") == ["rng_state_1.pth"]
    hf_dir = os.path.join(result.checkpoint.path, RayTrainReportCallback.CHECKPOINT_NAME)
    names = set(os.listdir(hf_dir))
    assert {"model.safetensors", "rng_state_0.pth", "rng_state_1.pth"} <= names, names
    assert result.metrics["step"] == 4
