"""Tiny Hugging Face models built from a config (no downloads) and synthetic token data."""

from __future__ import annotations

import numpy as np

VOCAB, SEQ = 64, 16


def tiny_bert_config(num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ * 2,
        num_labels=num_labels,
    )


def token_data(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids; the label is whether the first token is in the upper half of the
    vocabulary, so a model can learn it."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(rows, SEQ))
    return {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "labels": (ids[:, 0] >= VOCAB // 2).astype(np.int64),
    }
