"""Text classification with a Hugging Face ``Trainer`` on phalanx, as Ray's guide writes it.

Ray's "Get started with Hugging Face Transformers" with the imports changed
(``ray.train.huggingface.transformers`` -> ``phalanx.huggingface.transformers``,
``ray.train`` -> ``phalanx``). It runs anywhere, offline: the model is a tiny BERT built from a
config and saved with ``save_pretrained`` (the guide's ``from_pretrained`` path, from a local
directory instead of the Hub), and the data is synthetic token ids whose label is whether the
first token is in the upper half of the vocabulary.

    pip install -e ".[transformers]" "torch==2.13.0"
    python examples/transformers_text_classification.py            # 2 workers, CPU
    python examples/transformers_text_classification.py --max-steps 60 --storage-path /tmp/runs

Every ``checkpoint-N`` the Trainer saves is reported (``RayTrainReportCallback``) and kept by
phalanx by ``eval_loss``; HF's own ``output_dir`` stays HF's (``save_total_limit`` applies).
Run it again with the same ``--name`` and it resumes from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

import phalanx as train
from phalanx.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from phalanx.torch import TorchTrainer

VOCAB, SEQ_LEN = 128, 32


def synthetic_tokens(rows: int, seed: int) -> dict[str, np.ndarray]:
    """What a tokenizer would hand over: input_ids, attention_mask, and labels."""
    ids = np.random.default_rng(seed).integers(1, VOCAB, size=(rows, SEQ_LEN))
    labels = (ids[:, 0] >= VOCAB // 2).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels}


def compute_metrics(eval_pred: Any) -> dict[str, float]:
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def train_func(config: dict[str, Any]) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(config["model_dir"])

    # Each rank's shard, as batches of tensors; prepare_trainer feeds them to the Trainer.
    train_ds = train.get_dataset_shard("train").iter_torch_batches(batch_size=16)
    eval_ds = train.get_dataset_shard("evaluation").iter_torch_batches(batch_size=16)

    args = TrainingArguments(
        output_dir=config["output_dir"],
        max_steps=config["max_steps"],  # shards have no length: the Trainer needs max_steps
        eval_strategy="steps",
        eval_steps=config["save_steps"],
        save_strategy="steps",
        save_steps=config["save_steps"],
        save_total_limit=2,
        logging_steps=5,
        learning_rate=3e-3,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        compute_metrics=compute_metrics,
    )
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)

    checkpoint = train.get_checkpoint()
    if checkpoint:  # a retry after a failure, or this run started again
        with checkpoint.as_directory() as ckpt_dir:
            path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=path)
    else:
        trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "phalanx"))
    parser.add_argument("--name", default="transformers_text_classification")
    args = parser.parse_args()

    # The guide loads "bert-base-cased"; here a tiny BERT is saved locally and loaded the same way.
    model_dir = os.path.join(args.storage_path, f"{args.name}_base_model")
    if not os.path.isdir(model_dir):
        torch.manual_seed(0)
        bert = BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ_LEN,
            num_labels=2,
        )
        BertForSequenceClassification(bert).save_pretrained(model_dir)

    trainer = TorchTrainer(
        train_func,
        train_loop_config={
            "model_dir": model_dir,
            "output_dir": os.path.join(args.storage_path, f"{args.name}_hf_output"),
            "max_steps": args.max_steps,
            "save_steps": args.save_steps,
        },
        scaling_config=train.ScalingConfig(num_workers=args.num_workers),
        datasets={
            "train": train.data.from_numpy(synthetic_tokens(args.rows, seed=0)),
            "evaluation": train.data.from_numpy(synthetic_tokens(args.rows // 4, seed=1)),
        },
        run_config=train.RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            failure_config=train.FailureConfig(max_failures=1),
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="eval_loss", checkpoint_score_order="min"
            ),
        ),
    )
    result = trainer.fit()
    history = result.metrics_dataframe
    print(history[["step", "loss", "eval_loss", "eval_accuracy"]].to_string(index=False))

    best = result.get_best_checkpoint(metric="eval_loss", mode="min")
    assert best is not None
    with best.as_directory() as d:
        model = AutoModelForSequenceClassification.from_pretrained(
            os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME)
        )
    test = synthetic_tokens(256, seed=2)
    with torch.no_grad():
        logits = model(
            input_ids=torch.as_tensor(test["input_ids"]),
            attention_mask=torch.as_tensor(test["attention_mask"]),
        ).logits
    accuracy = float((logits.argmax(-1).numpy() == test["labels"]).mean())
    print(f"best checkpoint {best.path}: held-out accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
