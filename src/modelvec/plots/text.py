"""Text from the outside world (a model's name, a dataset) as a figure draws it."""

from __future__ import annotations

from ..core.errors import shown


def figure_text(text: str) -> str:
    """``text`` as a PNG figure draws it: control characters escaped (:func:`~modelvec.core.errors.shown`), since
    matplotlib has no glyph for them and its warning would write them raw to the terminal; ``$`` escaped, so that a
    name is not read as mathtext (set in italics, or refused as ``$\\foo$`` is)."""
    return shown(text, None).replace("$", r"\$")
