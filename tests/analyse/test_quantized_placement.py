"""A quantization's parent is the model it rounds, the nearest trace: a merge too, whose parents' shares its rounding
hides; where the rounding leaves the next model about as near, its node says so and names it."""

from __future__ import annotations

import numpy as np
import pytest

from modelvec.analyse.tree.lineage import infer_tree
from modelvec.analyse.tree.rule import TreeRule

SCALE = 1_000.0


def traces(seed: int, dim: int, rounding: float) -> tuple[list[str], np.ndarray]:
    """Two fine-tunes a, b of the base, their linear merge m, and a quantization q of m (``rounding`` times m's
    size, isotropic)."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(dim), rng.standard_normal(dim)
    m = 0.5 * a + 0.5 * b
    noise = rng.standard_normal(dim)
    q = m + rounding * np.linalg.norm(m) * noise / np.linalg.norm(noise)
    return ["a", "b", "m", "q"], np.stack([a, b, m, q])


def tree_of(models: list[str], t: np.ndarray, rule: TreeRule | None = None):
    levels = [1.0, 1.0, 1.0, 0.1]
    tree = infer_tree("base", models, t, SCALE, levels, quantized=["q"], rule=rule)
    return {n.model: n for n in tree.nodes}


@pytest.mark.parametrize("seed", range(8))
def test_a_quantization_of_a_merge_is_placed_under_the_merge_whose_shares_its_rounding_hides(seed):
    nodes = tree_of(*traces(seed, 64, 1.0))
    assert nodes["m"].kind == "merge" and sorted(nodes["m"].parents) == ["a", "b"]
    assert nodes["q"].kind == "quantization" and nodes["q"].parent == "m"


def test_a_rounding_that_leaves_the_next_model_as_near_is_said_unsure_naming_it():
    fine, coarse = tree_of(*traces(0, 4096, 0.05)), tree_of(*traces(0, 4096, 20.0))
    assert fine["q"].parent == "m" and fine["q"].note is None and fine["q"].confidence >= TreeRule().quantized_sure
    q = coarse["q"]  # a rounding 20 times the merge's delta: a, b and m are about as near
    assert q.parent in {"a", "b", "m"} and q.confidence < TreeRule().quantized_sure
    assert q.note is not None and q.note.startswith("unsure: ")
    assert q.note.split()[1] in {"a", "b", "m", "base"} - {q.parent}  # the next nearest, named
    never = tree_of(*traces(0, 4096, 20.0), rule=TreeRule(quantized_sure=0.5 + 1e-9))
    assert never["q"].note is None  # the setting decides
