"""A comparison's sweep: the values of the representation's fields that ``evaluate`` compares.

CacheFile apart from :mod:`modelvec.studies.compare` (which imports torch) so that the command line names the swept
fields without loading it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.settings import check_field
from ..represent.representation import Representation

#: The fields of :class:`Representation` a comparison sweeps: :func:`~modelvec.studies.grid.variants` takes the rank, rows
#: (with ``auto_rows`` for ``rows="auto"``), projection and probe (the CountSketch's), :func:`~modelvec.studies.compare.evaluate`
#: the seed (its scores are the mean over seeds).
SWEPT = ("rank", "rows", "auto_rows", "projection", "probe", "seed")


@dataclass(frozen=True, init=False)
class Sweep:
    """The values of :class:`Representation`'s fields that a comparison sweeps (:data:`SWEPT`), each in order:
    ``Sweep(rank=(8, 16, 32), rows=("auto", 1))``, read as ``sweep["rank"]``.

    A field not given has one value, its declared default (the one ``embed`` uses), so the API and ``evaluate``'s
    options (made from the same declarations: :func:`modelvec.cli.sweeps.with_sweeps`) share it. Every value is
    checked as its field's declaration says (an int for a float field is a float: ``rows=1`` is ``1.0``)."""

    values: tuple[tuple[str, tuple[Any, ...]], ...]  # every field of SWEPT, in its order, with its values

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(SWEPT))
        if unknown:
            raise ValueError(f"a sweep takes {', '.join(SWEPT)}, not {', '.join(unknown)}")
        defaults = {f.name: f.default for f in dataclasses.fields(Representation)}
        swept = []
        for name in SWEPT:
            value = values.get(name, defaults[name])
            several = (value,) if isinstance(value, str) or not isinstance(value, Iterable) else tuple(value)
            if not several:
                raise ValueError(f"{name}: a sweep needs at least one value")
            swept.append((name, tuple(check_field(Representation, name, v) for v in several)))
        object.__setattr__(self, "values", tuple(swept))

    def __getitem__(self, name: str) -> tuple[Any, ...]:
        return dict(self.values)[name]
