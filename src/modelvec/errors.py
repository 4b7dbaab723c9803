"""Errors that name the model and the cause in one line, so a batch run can record them and go on."""

from __future__ import annotations


class ModelvecError(Exception):
    """A problem with one model's input; ``str(err)`` is ``"<model>: <cause>"``."""

    def __init__(self, model: str, cause: str) -> None:
        self.model = model
        self.cause = cause
        super().__init__(f"{_one_line(model)}: {_one_line(cause)}")


def _one_line(text: str) -> str:
    """Printable and on one line: a model's name comes from a folder or the Hub and may hold anything."""
    text = str(text)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


class CheckpointError(ModelvecError):
    """The checkpoint cannot be read: missing files, bad format, missing tensor, NaN/Inf."""


class ArchitectureError(ModelvecError):
    """The architecture is unknown or its config cannot tell which family it is."""


class IncompatibleError(ModelvecError):
    """A fine-tune does not match its base: another family or another matrix shape."""
