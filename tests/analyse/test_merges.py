"""The merge finder on traces whose relations are known exactly: what it names, and what it declines to name."""

from __future__ import annotations

import numpy as np
import pytest

from modelvec.analyse.tree.merges import MergeFinder
from modelvec.analyse.tree.rule import TreeRule


def finder(
    rounding: float, seed: int = 0, noise: float = 4.0, weights: tuple[float, float] = (0.5, 0.5)
) -> tuple[MergeFinder, int]:
    """Two parents and a merge of them (``weights``) that a linear fit explains only in part (what trimming leaves:
    ``noise``, its size, the parents' 10) and that left far more entries as the base's than they did: the finder's
    trimmed path. ``rounding``: the expected size of the merge's rounding to its own precision (the base's scale 1)."""
    rng = np.random.default_rng(seed)
    p1, p2 = rng.normal(size=(2, 4000)) * 10 / np.sqrt(4000)
    left = rng.normal(size=4000)
    merge = weights[0] * p1 + weights[1] * p2 + noise * left / np.linalg.norm(left)
    traces = np.stack([p1, p2, merge])
    gram = traces @ traces.T
    stats = {"zeros": [0.05, 0.05, 0.3], "rounding": [0.0, 0.0, rounding]}
    found = MergeFinder(
        dots=lambda i: gram[i],
        products=lambda rows: gram[np.ix_(rows, rows)],
        norms=np.sqrt(np.diag(gram)),
        usable=np.ones(3, dtype=bool),
        statistics=stats,
        rule=TreeRule(),
        scale=1.0,
    )
    return found, 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_trimmed_merge_is_named_where_its_residual_exceeds_the_rounding(seed):
    found, i = finder(rounding=0.5, seed=seed)
    merge = found.find(i)
    assert merge is not None and sorted(merge.parents) == [0, 1]
    assert merge.method in ("ties", "dare")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_trimmed_fit_within_the_rounding_is_a_merge_of_untold_method(seed):
    # what the fit leaves (4.0) is no more than 1.5 x the rounding (3.0): rounding alone could have left it
    found, i = finder(rounding=3.0, seed=seed)
    merge = found.find(i)
    assert merge is not None and sorted(merge.parents) == [0, 1]
    assert merge.method is None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.4, 0.6)])
def test_a_trimmed_merge_whose_drop_noise_dwarfs_its_parents_is_still_named(seed, weights):
    # DARE at a low density: the noise (20, the parents 10) leaves each parent alone almost as much as both, so the
    # residual ratio is near 1 (0.96-0.98); what the two explain beyond the best one is still a third or more
    found, i = finder(rounding=0.5, seed=seed, noise=20.0, weights=weights)
    fit = found._fit(i, [0, 1])
    assert fit.ratio([0, 1]) > TreeRule().trimmed_ratio  # the ratio alone would refuse it
    merge = found.find(i)
    assert merge is not None and sorted(merge.parents) == [0, 1] and merge.method == "dare"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_parent_and_noise_with_many_entries_left_is_no_merge(seed):
    # as many entries left as the base's as a trimmed merge, but one model's delta and noise: the other parent
    # explains nothing beyond it (a chance weight, a gain near 0)
    found, i = finder(rounding=0.5, seed=seed, noise=20.0, weights=(1.0, 0.0))
    assert found.find(i) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_model_is_never_a_trimmed_merge_of_models_that_hold_all_of_it(seed):
    # a chain's first member (its delta p, more entries left as the base's than its descendants) and two models
    # holding all of it and more (a later fine-tune p + q, a merge of it p + r): fitted on them it would leave 0.82
    # of what either alone leaves, but they go beyond it, as its children would
    rng = np.random.default_rng(seed)
    p, q, r = rng.normal(size=(3, 4000)) * 10 / np.sqrt(4000)
    traces = np.stack([p, p + q, p + r])
    gram = traces @ traces.T
    found = MergeFinder(
        dots=lambda i: gram[i],
        products=lambda rows: gram[np.ix_(rows, rows)],
        norms=np.sqrt(np.diag(gram)),
        usable=np.ones(3, dtype=bool),
        statistics={"zeros": [0.3, 0.05, 0.05], "rounding": [0.5, 0.5, 0.5]},
        rule=TreeRule(),
        scale=1.0,
    )
    assert found._fit(0, [1, 2]).ratio([0, 1]) < TreeRule().trimmed_ratio  # the fit alone would name it a merge
    assert found.find(0) is None
