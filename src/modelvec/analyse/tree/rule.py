"""The thresholds by which the model tree is inferred (:mod:`modelvec.analyse.tree`) and its merges found
(:mod:`modelvec.analyse.tree.merges`): one settings object that both read, so neither module imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.settings import setting, validate


@dataclass(frozen=True, kw_only=True)
class TreeRule:
    """The thresholds of the inference (see the module docstring and :mod:`modelvec.analyse.tree.merges`), each declared
    and checked as every setting is; the defaults were chosen on the selection halves of the tree evidence zoos
    (docs/tree.md)."""

    unrelated_size: float = setting(
        0.5, "|delta| / |base weights| above which weights are unrelated (random: 1.06-1.41).", above=0
    )
    quantized_levels: float = setting(
        0.75, "Distinct values a row, against the base's, below which a model is rounded.", above=0, maximum=1
    )
    quantized_sure: float = setting(
        0.55,
        "A quantization's placement confidence (its nearest model against the next) below which its node says it is "
        "unsure, naming the next: its rounding hides which of the two it rounds.",
        above=0.5,
        maximum=1,
    )
    merge_ratio: float = setting(
        0.5, "A merge's residual against its best single model's, at most (bf16 rounding: ~0.3).", above=0, maximum=1
    )
    merge_weight: float = setting(0.05, "The least weight of a merge's parent.", above=0, maximum=1)
    merge_candidates: int = setting(24, "The models nearest in direction a merge is fitted on.", minimum=2)
    beyond: tuple[float, ...] = setting(
        (0.8, 1.6), "The share of a parent's delta a child holds: (least, most).", many=True, kind=float, above=0
    )
    duplicate: float = setting(
        0.98, "Cosine above which two traces are near-duplicates, never each other's merge parents.", above=0, maximum=1
    )
    trimmed_zeros: float = setting(
        0.04, "Share of entries left as the base's by which a TIES or DARE merge exceeds its parents.", above=0
    )
    trimmed_ratio: float = setting(
        0.9, "A trimmed merge's residual against its best single model's, at most.", above=0, maximum=1
    )
    trimmed_gain: float = setting(
        0.15,
        "A trimmed merge's parents together explain at least this share more than the best of them alone.",
        above=0,
        maximum=1,
    )
    dropped_share: float = setting(
        0.05,
        "Share of a merge's telling entries each parent alone explains beyond chance (the others dropped them).",
        above=0,
        maximum=1,
    )
    ties_ratio: float = setting(0.75, "Below this residual ratio a trimmed merge is TIES, above DARE.", above=0)
    slerp_excess: float = setting(
        1e-4,
        "The delta's lean along the base's weights beyond its parents' weighted sum above which it is SLERP.",
        above=0,
    )
    rounding: float = setting(
        1.5, "A merge's residual may be this many times the rounding to its precision (bf16) expected of it.", above=0
    )
    resaved: float = setting(
        0.999,
        "Share of a model's entries read equal to the base's rounded to its dtype from which it is a re-save of it.",
        above=0,
        maximum=1,
    )
    weights_sum: float = setting(
        0.1, "How far a linear merge's weights may sum from one (beyond: task arithmetic).", minimum=0
    )

    def __post_init__(self) -> None:
        validate(self)
        if len(self.beyond) != 2 or self.beyond[0] >= self.beyond[1]:
            raise ValueError(f"beyond must be two numbers, the least below the most, not {self.beyond!r}")
