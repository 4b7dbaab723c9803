"""The copies rule on made traces (:mod:`modelvec.analyse.tree.copies`): which models are copies, of which original, and
which rule chose it; a re-save is found by its rounding, a fine-tune as near the base is not."""

from __future__ import annotations

import numpy as np

from modelvec.analyse.tree.copies import BY_BASE, BY_CARD, BY_DATE, BY_NAME, BY_PRECISION, Traced, find_copies, mini_of
from modelvec.analyse.tree.rule import TreeRule

D = 4096
SCALE = 100.0
ROUNDING = {"float32": 3e-8, "bfloat16": 1.1e-3, "float16": 1.4e-4}


def traced(rows: dict[str, tuple[np.ndarray, str, float]], minis: bool = True) -> tuple[Traced, np.ndarray]:
    """Models by name: (trace, dtype, share of entries the base's rounded to it); ``minis``: their minis kept."""
    t = np.stack([v for v, _, _ in rows.values()])
    norms = np.linalg.norm(t, axis=1)
    return (
        Traced(
            models=list(rows),
            digest=[str(hash(v.tobytes())) for v, _, _ in rows.values()],
            zero=[bool(n == 0) for n in norms],
            norm=[float(n) for n in norms],
            precision=[p for _, p, _ in rows.values()],
            rounding=[ROUNDING[p] for _, p, _ in rows.values()],
            same=[s for _, _, s in rows.values()],
            resaved=[True] * len(rows),
            scale=SCALE,
            mini=[mini_of(v) for v, _, _ in rows.values()] if minis else None,
        ),
        t,
    )


def run(rows, named=None, created=None, minis=True):
    found, t = traced(rows, minis)
    asked = []

    def distance(pairs):
        asked.extend(pairs)
        return np.array([np.linalg.norm(t[i] - t[j]) for i, j in pairs])

    about = lambda names: (
        {m: (named or {}).get(m, []) for m in names},
        {m: (created or {})[m] for m in names if m in (created or {})},
    )
    return find_copies(found, distance, base="base", rule=TreeRule(), about=about), asked


def delta(seed: int, size: float) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(D)
    return v / np.linalg.norm(v) * size * SCALE


def rounding(seed: int, dtype: str) -> np.ndarray:
    """A re-save's rounding in the trace's map: its expected size, random."""
    return delta(1000 + seed, ROUNDING[dtype])


def test_re_saves_of_a_fine_tune_and_of_the_base_and_who_the_original_is():
    ft = delta(1, 0.05)
    rows = {
        "ft": (ft, "float32", 0.02),
        "ft-bf16": (ft + rounding(1, "bfloat16"), "bfloat16", 0.02),
        "ft-fp16": (ft + rounding(2, "float16"), "float16", 0.02),
        "other": (delta(2, 0.05), "float32", 0.02),
        "base-fp16": (rounding(3, "float16"), "float16", 1.0),
    }
    found, _ = run(rows)
    assert {m: (c.original, c.exact, c.chosen_by) for m, c in found.items()} == {
        "ft-bf16": ("ft", False, BY_PRECISION),
        "ft-fp16": ("ft", False, BY_PRECISION),
        "base-fp16": ("base", False, BY_BASE),
    }
    assert found["ft-bf16"].describe("base") == "a bfloat16 re-save of ft (equal up to rounding)"


def test_the_original_by_card_then_date_then_precision_then_name():
    ft = delta(1, 0.05)
    same = {"a": (ft, "float32", 0.02), "b": (ft.copy(), "float32", 0.02), "c": (ft.copy(), "float32", 0.02)}
    by_card, _ = run(same, named={"a": ["c"], "b": ["c"]}, created={"a": "1", "b": "2", "c": "3"})
    assert {m: (c.original, c.chosen_by) for m, c in by_card.items()} == {"a": ("c", BY_CARD), "b": ("c", BY_CARD)}
    by_date, _ = run(same, created={"a": "3", "b": "1", "c": "2"})
    assert {m: c.original for m, c in by_date.items()} == {"a": "b", "c": "b"} and by_date["a"].chosen_by == BY_DATE
    by_name, _ = run(same, created={"a": "1", "b": "1", "c": "1"})
    assert {m: (c.original, c.chosen_by, c.exact) for m, c in by_name.items()} == {
        "b": ("a", BY_NAME, True),
        "c": ("a", BY_NAME, True),
    }


def test_a_fine_tune_as_near_the_base_as_a_re_save_is_none_and_a_near_original_needs_a_card():
    short = delta(5, ROUNDING["bfloat16"] * 0.8)
    rows = {
        "short-bf16": (short + rounding(4, "bfloat16"), "bfloat16", 0.8),  # trained: a fifth of its entries moved
        "tiny-fp32": (delta(6, ROUNDING["bfloat16"] * 0.5), "float32", 0.01),
        "tiny-bf16": (delta(6, ROUNDING["bfloat16"] * 0.5) + rounding(7, "bfloat16"), "bfloat16", 0.9),
    }
    found, _ = run(rows)
    assert found == {}  # the short fine-tune is no re-save of the base; tiny-bf16 near tiny-fp32 tells nothing alone
    named, _ = run(rows, named={"tiny-bf16": ["tiny-fp32"]})
    assert list(named) == ["tiny-bf16"] and named["tiny-bf16"].original == "tiny-fp32"


def test_only_models_of_a_finer_dtype_near_in_norm_and_mini_are_compared():
    n = 2000
    rng = np.random.default_rng(0)
    rows = {f"m{i}": (delta(i, rng.uniform(0.01, 0.1)), "bfloat16", 0.05) for i in range(n)}
    rows |= {f"f{i}": (delta(10_000 + i, rng.uniform(0.01, 0.1)), "float32", 0.05) for i in range(n // 10)}
    rows |= {"f0-bf16": (rows["f0"][0] + rounding(9, "bfloat16"), "bfloat16", 0.05)}  # one re-save among them
    whole, by_norm = run(rows, minis=False)
    found, by_mini = run(rows)
    assert list(found) == list(whole) == ["f0-bf16"] and found["f0-bf16"].original == "f0"
    assert len(by_norm) < n * (n // 10) / 20  # a window of norms, not every pair
    assert 0 < len(by_mini) < len(by_norm) / 20  # and of those, the minis within twice the rounding
