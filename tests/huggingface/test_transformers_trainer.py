"""AIR's deprecated ``TransformersTrainer``: its docstring example (a causal LM built from a
config, ``trainer_init_per_worker`` with epoch strategies, "train" + "evaluation" datasets) on 2
real workers, a tiny GPT-2 and synthetic tokens; a worker killed mid-fit resumes from the last
checkpoint, as AIR's did."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

# Imported here so the workers, forked from this process, start with them loaded.
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

import phalanx
from phalanx import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from phalanx.errors import ConfigError
from phalanx.huggingface import TransformersTrainer
from phalanx.huggingface.transformers import RayTrainReportCallback

VOCAB, SEQ = 64, 16
ROWS, BATCH, EPOCHS = 64, 8, 3  # 32 rows per rank: 4 steps per epoch, 12 in all


def lm_data(rows: int, seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, VOCAB, size=(rows, SEQ))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}


class KillRank1(TrainerCallback):
    """Rank 1 dies (SIGKILL) mid-epoch 2 of the first attempt, after the epoch-1 checkpoint."""

    def on_step_end(self, args, state, control, **kwargs):
        ctx = phalanx.get_context()
        if (ctx.get_attempt(), ctx.get_world_rank(), state.global_step) == (0, 1, 6):
            os.kill(os.getpid(), signal.SIGKILL)


def trainer_init_per_worker(train_dataset, eval_dataset, **config):
    # The AIR docstring's function, with a tiny model and today's argument names.
    torch.manual_seed(0)
    model_config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(model_config)
    args = transformers.TrainingArguments(
        output_dir=config["output_dir"],
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_strategy="epoch",
        learning_rate=config["lr"],
        weight_decay=0.01,
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,  # CPU workers: pinning only warns
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        callbacks=[KillRank1()],
    )


def test_deprecation_warning_shows_the_modern_form():
    with pytest.warns(DeprecationWarning, match="TransformersTrainer is deprecated") as caught:
        TransformersTrainer(trainer_init_per_worker, scaling_config=ScalingConfig(num_workers=1))
    message = str(caught[0].message)
    assert "prepare_trainer(trainer_init_per_worker(" in message
    assert "TorchTrainer(train_func, train_loop_config=trainer_init_config" in message
    assert caught[0].filename == __file__  # points at the caller's line


def test_an_init_function_without_config_is_refused_before_fit():
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="fewer than 3"):
        TransformersTrainer(lambda train, evaluation: None)


@pytest.mark.slow
def test_air_docstring_flow_on_two_workers_resumes_after_a_killed_worker(tmp_path):
    with pytest.warns(DeprecationWarning):
        trainer = TransformersTrainer(
            trainer_init_per_worker=trainer_init_per_worker,
            trainer_init_config={"output_dir": str(tmp_path / "hf"), "lr": 5e-3},
            scaling_config=ScalingConfig(num_workers=2),
            datasets={
                "train": phalanx.data.from_numpy(lm_data(ROWS, 0)),
                "evaluation": phalanx.data.from_numpy(lm_data(16, 1)),
            },
            run_config=RunConfig(
                name="air_hf",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=1),
                checkpoint_config=CheckpointConfig(num_to_keep=3),
            ),
        )
    result = trainer.fit()

    assert result.error is None and result.attempts == 2
    # The retry resumed HF from the epoch-1 checkpoint (step 4): each epoch's checkpoint was
    # reported once, with that epoch's train and eval metrics (a restart would redo step 4).
    saved = sorted((m["step"], m["epoch"]) for _, m in result.best_checkpoints)
    assert saved == [(4, 1.0), (8, 2.0), (12, 3.0)]
    for checkpoint, metrics in result.best_checkpoints:
        assert np.isfinite(metrics["eval_loss"]) and np.isfinite(metrics["loss"])
        hf_dir = os.path.join(checkpoint.path, RayTrainReportCallback.CHECKPOINT_NAME)
        assert {"model.safetensors", "trainer_state.json", "rng_state_1.pth"} <= set(
            os.listdir(hf_dir)
        )
    # One round per epoch (its log, evaluation and save), then HF's closing summary.
    assert result.metrics_dataframe["step"].tolist() == [4, 8, 12, 12]
    # AIR's last report: HF's closing summary with the last evaluation.
    assert {"train_runtime", "train_loss", "eval_loss"} <= set(result.metrics)
    assert result.metrics["step"] == EPOCHS * ROWS // 2 // BATCH

    with result.checkpoint.as_directory() as d:
        model = GPT2LMHeadModel.from_pretrained(
            os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        )
    ids = torch.as_tensor(lm_data(2, 3)["input_ids"])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def steps_trainer_init(train_dataset, eval_dataset, **config):
    # A schedule AIR refused (logging_steps != eval_steps, load_best_model_at_end=True).
    args = transformers.TrainingArguments(
        output_dir=config["output_dir"],
        max_steps=8,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="steps",
        save_steps=4,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        per_device_train_batch_size=BATCH,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2)
    )
    return transformers.Trainer(
        model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset
    )


@pytest.mark.slow
def test_a_schedule_air_refused_reports_every_log_and_each_checkpoint(tmp_path):
    with pytest.warns(DeprecationWarning):
        trainer = TransformersTrainer(
            steps_trainer_init,
            trainer_init_config={"output_dir": str(tmp_path / "hf")},
            scaling_config=ScalingConfig(num_workers=2),
            datasets={
                "train": phalanx.data.from_numpy(lm_data(ROWS, 0)),
                "evaluation": phalanx.data.from_numpy(lm_data(16, 1)),
            },
            run_config=RunConfig(name="air_hf_steps", storage_path=str(tmp_path / "runs")),
        )
    result = trainer.fit()

    assert result.error is None
    # A round per log (steps 2 and 6), one per save with its checkpoint (4, 8), then the summary.
    assert result.metrics_dataframe["step"].tolist() == [2, 4, 6, 8, 8]
    assert sorted(m["step"] for _, m in result.best_checkpoints) == [4, 8]
    assert all(np.isfinite(m["eval_loss"]) for _, m in result.best_checkpoints)
