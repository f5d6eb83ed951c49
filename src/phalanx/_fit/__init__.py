"""The driver side of ``fit()`` under the trainer: restore, elastic size, shards, logs."""
