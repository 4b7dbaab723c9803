"""What the scores take, checked where they enter: the scoring settings (:class:`Scoring`, declared once), the
vectors (a finite float64 matrix), the labels (one sequence of dataset names per model) and a per-model grouping.

The functions of :mod:`modelvec.analyse.scores` and :mod:`modelvec.analyse.neighbours` check their parameters with
:func:`~modelvec.core.settings.validate_params`, against these declarations and checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.settings import check_field, setting, validate

METRICS = ("cosine", "euclidean")
SCALINGS = ("none", "mutual-proximity")
#: ``auto``: mutual proximity where the models mix LoRA adapters and full fine-tunes, their distances as they are
#: otherwise (:meth:`Scoring.scaling_for`). On the evidence zoo mutual proximity added 0.04-0.06 to the kNN score
#: of every representation over the mixed collection and nothing among full fine-tunes (docs/evidence.md).
AUTO = "auto"
POOLS = ("labelled", "all")


@dataclass(frozen=True)
class Scoring:
    """How neighbours are found and counted, each setting declared once (the CLI's options are made from them):
    validated once, passed whole to ``cluster``, ``neighbors`` and ``evaluate``."""

    metric: str = setting("cosine", "Distance between vectors.", choices=METRICS)
    scaling: str = setting(
        AUTO,
        "Rank neighbours by the distance as it is (none), by mutual proximity (mutual-proximity: puts adapters and "
        "full fine-tunes on one scale), or by mutual proximity where the models mix both kinds (auto).",
        choices=(AUTO, *SCALINGS),
    )
    pool: str = setting(
        "labelled",
        "The kNN score's neighbours: labelled models only, or all (unlabelled ones count as misses).",
        choices=POOLS,
    )
    k: int = setting(5, "Nearest labelled models that vote for a model's predicted dataset.", minimum=1)

    def __post_init__(self) -> None:
        validate(self)

    def scaling_for(self, adapter: Sequence[object]) -> tuple[str, str | None]:
        """The scaling to rank these models by, and why when ``auto`` chose it. ``adapter``: per model, True for a
        LoRA adapter, False for a full fine-tune, None (or NaN) where the store does not know (a
        store written before it kept it)."""
        if self.scaling != AUTO:
            return self.scaling, None
        kinds = [bool(a) if isinstance(a, (bool, np.bool_)) else None for a in adapter]
        adapters, full, unknown = kinds.count(True), kinds.count(False), kinds.count(None)
        if adapters and full:
            return "mutual-proximity", (
                f"neighbours by mutual proximity: {adapters} LoRA adapters and {full} full fine-tunes "
                "(--scaling none: by distance alone)"
            )
        if unknown:
            return "none", (
                f"neighbours by distance: {unknown} models were stored before modelvec kept whether a model is an "
                "adapter (embed --force records it; --scaling mutual-proximity where adapters and full fine-tunes mix)"
            )
        return "none", None


#: How ``neighbors`` finds them unless told: 10 listed (and voting), by cosine distance.
NEIGHBORS_SCORING = Scoring(k=10)


def field_of(cls: type) -> Callable[[str, object], Any]:
    """A check of a parameter as ``cls`` declares its field of that name (:func:`~modelvec.core.settings.check_field`):
    a rule declared once, stated at a boundary as every other check is, a function of (name, value)."""
    return lambda name, value: check_field(cls, name, value)


def check_scaling(name: str, scaling: object) -> str:
    """One of :data:`SCALINGS` (``auto`` is resolved first, from the models' kinds: :meth:`Scoring.scaling_for`)."""
    if scaling not in SCALINGS:
        hint = ": resolve it from the models' kinds first (Scoring.scaling_for)" if scaling == AUTO else ""
        raise ValueError(f"{name} must be one of {', '.join(SCALINGS)}, not {scaling!r}{hint}")
    return str(scaling)


def integer(minimum: int) -> Callable[[str, object], int]:
    """A check of an integer parameter (numpy's integers too) of at least ``minimum``: a row index, a seed."""

    def check(name: str, value: object) -> int:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")
        return int(value)

    return check


def as_matrix(X: np.ndarray, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 (n_models, dim) array; a copy, so callers may modify it."""
    M = np.asarray(X)
    if M.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_models, dim), not shape {M.shape}")
    if not (np.issubdtype(M.dtype, np.floating) or np.issubdtype(M.dtype, np.integer)):
        raise ValueError(f"{name} must be numeric, not {M.dtype}")
    M = np.array(M, dtype=np.float64)
    if not np.isfinite(M).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return M


def label_sets(labels: Sequence[Sequence[str]], n: int) -> list[frozenset[str]]:
    """One frozenset per model; a bare string per model is refused (it would be split into letters)."""
    if isinstance(labels, str) or len(labels) != n:
        raise ValueError(
            f"labels must hold one sequence of dataset names per model ({n}), "
            f"not {len(labels) if not isinstance(labels, str) else 'a string'}"
        )
    sets = []
    for i, entry in enumerate(labels):
        if isinstance(entry, str) or not all(isinstance(x, str) and x for x in entry):
            raise ValueError(
                f"labels[{i}] must be a sequence of non-empty dataset names "
                f"(e.g. ['imdb'], or [] when unlabelled), not {entry!r}"
            )
        sets.append(frozenset(entry))
    return sets


def membership(sets: list[frozenset[str]]) -> tuple[list[str], np.ndarray]:
    """Sorted dataset names and the (n_models, n_datasets) membership matrix."""
    names = sorted(set().union(*sets)) if sets else []
    column = {name: j for j, name in enumerate(names)}
    member = np.zeros((len(sets), len(names)), dtype=bool)
    for i, s in enumerate(sets):
        member[i, [column[x] for x in s]] = True
    return names, member


def group_codes(values: Sequence[object] | None, n: int) -> np.ndarray | None:
    """Int codes of a per-model grouping (e.g. author); None, "" and NaN are -1 (no group)."""
    if values is None:
        return None
    if len(values) != n:
        raise ValueError(f"exclude_same has {len(values)} entries for {n} models")
    codes: dict[object, int] = {}
    out = np.full(n, -1, np.int64)
    for i, v in enumerate(values):
        if v is None or v == "" or (isinstance(v, float) and v != v):
            continue
        out[i] = codes.setdefault(v, len(codes))
    return out
