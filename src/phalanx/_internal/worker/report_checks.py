"""What ``report()`` refuses, checked before the round is taken: a report that fails here
changes nothing (the rank's next report() is the same round)."""

from __future__ import annotations

from phalanx.checkpoint import Checkpoint, CheckpointUploadMode


def upload_mode(value: CheckpointUploadMode | str) -> CheckpointUploadMode:
    if isinstance(value, CheckpointUploadMode):
        return value
    try:
        return CheckpointUploadMode(str(value).lower())
    except ValueError:
        raise ValueError(
            f"checkpoint_upload_mode={value!r} is invalid: use CheckpointUploadMode.SYNC, "
            "ASYNC or NO_UPLOAD."
        ) from None


def check_validation(validation: object, checkpoint: Checkpoint | None, configured: bool) -> None:
    from phalanx.validation import ValidationTaskConfig

    if not isinstance(validation, bool | ValidationTaskConfig):
        raise TypeError(
            f"report(validation={validation!r}) is invalid: pass True, False or a "
            "phalanx.ValidationTaskConfig."
        )
    if validation and checkpoint is None:
        raise ValueError(
            "report(validation=...) validates a checkpoint, but no checkpoint was passed.\n"
            "HINT: pass checkpoint=... in the same report() call."
        )
    if validation and not configured:
        raise ValueError(
            "report(validation=...) needs a validation function, but the trainer has none.\n"
            "HINT: pass validation_config=phalanx.ValidationConfig(fn) to the trainer."
        )


def check_upload_fn(fn: object, mode: CheckpointUploadMode) -> None:
    if fn is not None and mode is CheckpointUploadMode.NO_UPLOAD:
        raise ValueError(
            "report(checkpoint_upload_fn=...) uploads the checkpoint, but "
            "checkpoint_upload_mode=NO_UPLOAD says there is nothing to upload.\n"
            "HINT: drop one of the two."
        )


def check_checkpoint(checkpoint: object) -> None:
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            f"report(checkpoint=...) takes a phalanx.Checkpoint, got "
            f"{type(checkpoint).__name__}. HINT: Checkpoint.from_directory(path)."
        )
