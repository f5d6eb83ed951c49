# ruff: noqa  (Ray's doc code as Ray writes it: late imports, unused names)
# Ray 2.60 docs, "Get Started with Distributed Training using Hugging Face Transformers"
# (doc/source/train/doc_code/getting_started_transformers.py), in Ray's own form. Synthetic data
# (no downloads): a tiny BERT built from a config instead of bert-base-cased, random token ids
# instead of yelp_review_full, accuracy computed with numpy instead of `evaluate`; 2 CPU workers,
# 4 steps.
import numpy as np
import torch
from transformers import (
    Trainer,
    TrainingArguments,
    BertConfig,
    BertForSequenceClassification,
)

import ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, rows, seed):
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(1, 64, size=(rows, 16))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = torch.tensor(self.ids[i])
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": torch.tensor(int(self.ids[i][0] >= 32)),
        }


# [1] Encapsulate data preprocessing, training, and evaluation
# logic in a training function
# ============================================================
def train_func(config):
    # Datasets
    small_train_dataset = TokenDataset(32, seed=0)
    small_eval_dataset = TokenDataset(16, seed=1)

    # Model
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            num_labels=2,
        )
    )

    # Evaluation Metrics
    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        predictions = np.argmax(logits, axis=-1)
        return {"accuracy": float((predictions == labels).mean())}

    # Hugging Face Trainer
    training_args = TrainingArguments(
        output_dir="test_trainer",
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        max_steps=4,
        use_cpu=True,
        report_to="none",
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_dataset,
        eval_dataset=small_eval_dataset,
        compute_metrics=compute_metrics,
    )

    # [2] Report Metrics and Checkpoints to Ray Train
    # ===============================================
    callback = ray.train.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)

    # [3] Prepare Transformers Trainer
    # ================================
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)

    # Start Training
    trainer.train()


# [4] Define a Ray TorchTrainer to launch `train_func` on all workers
# ===================================================================
ray_trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2, use_gpu=False))
result = ray_trainer.fit()

assert result.error is None
assert "eval_accuracy" in result.metrics
assert result.checkpoint is not None
print("ROUNDTRIP-OK")
