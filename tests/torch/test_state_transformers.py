"""save_state from a Hugging Face TrainerCallback (docs/guides/checkpoints.md's example): real
transformers, a tiny BERT built from a config, 2 CPU workers (DDP, gloo); a resumed run loads the
model, the optimizer, the LR scheduler and the step back."""

from __future__ import annotations

from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from _helpers.hf_tiny import SEQ, VOCAB, tiny_bert_config  # noqa: E402
from resumed_fit import fit_then_resume  # noqa: E402
from transformers import (  # noqa: E402
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import phalanx  # noqa: E402
from phalanx.torch import load_state, save_state  # noqa: E402

pytestmark = pytest.mark.slow


# -- the checkpoints guide's example ---------------------------------------------------------------
class SaveState(TrainerCallback):
    """Every ``every`` steps: the model, the optimizer, the LR scheduler and the step as a
    save_state checkpoint. When the run resumes, they are loaded back as training begins."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_begin(self, args, state, control, model, optimizer, lr_scheduler, **kwargs):
        if checkpoint := phalanx.get_checkpoint():
            saved = {"model": model, "optimizer": optimizer, "scheduler": lr_scheduler, "step": 0}
            load_state(checkpoint, saved)
            state.global_step = saved["step"]  # the Trainer stops at max_steps from there

    def on_step_end(self, args, state, control, model, optimizer, lr_scheduler, **kwargs):
        if state.global_step % self.every == 0:
            saved = {"model": model, "optimizer": optimizer, "scheduler": lr_scheduler}
            checkpoint = save_state({**saved, "step": state.global_step})
            phalanx.report({"step": state.global_step}, checkpoint=checkpoint)


# -------------------------------------------------------------------------------------------------


def fingerprint(model, optimizer, lr_scheduler) -> list[float]:
    exp_avg = [s["exp_avg"] for s in optimizer.state.values() if "exp_avg" in s]
    return [
        float(sum(p.detach().double().sum() for p in model.parameters())),
        float(sum(m.double().sum() for m in exp_avg)),
        float(lr_scheduler.get_last_lr()[0]),
    ]


class Fingerprints(TrainerCallback):
    """What the test compares: the state as training begins (after a load) and at the end."""

    def on_train_begin(self, args, state, control, model, optimizer, lr_scheduler, **kwargs):
        self.start = fingerprint(model, optimizer, lr_scheduler)

    def on_train_end(self, args, state, control, model, optimizer, lr_scheduler, **kwargs):
        self.end = fingerprint(model, optimizer, lr_scheduler)
        self.steps = state.global_step


def train_func(config: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(config["seed"])  # a resumed run starts from other weights
    ids = torch.randint(1, VOCAB, (64, SEQ))
    rows = [
        {
            "input_ids": i,
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": int(i[0] > 32),
        }
        for i in ids
    ]
    args = TrainingArguments(
        output_dir=config["root"],
        max_steps=config["max_steps"],
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",  # the callback checkpoints
        dataloader_pin_memory=False,  # CPU only: pinning would only warn
        report_to="none",
        disable_tqdm=True,
    )
    prints = Fingerprints()
    model = BertForSequenceClassification(tiny_bert_config())
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.add_callback(SaveState(every=2))
    trainer.add_callback(prints)  # after SaveState: it looks once the state is loaded
    trainer.train()
    return {"start": prints.start, "end": prints.end, "steps": prints.steps}


def test_a_transformers_callback_saves_and_a_resumed_run_loads_the_whole_state(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the Hub
    first, resumed = fit_then_resume(
        train_func, tmp_path, {"max_steps": 4, "seed": 0}, {"max_steps": 6, "seed": 1}
    )
    assert list(first.metrics_dataframe["step"]) == [2, 4]
    assert resumed.return_value["steps"] == 6
    assert list(resumed.metrics_dataframe["step"]) == [6]  # only the steps still to run
