"""The merge finder on traces whose relations are known exactly: what it names, and what it declines to name."""

from __future__ import annotations

import numpy as np
import pytest

from modelvec.analyse.merges import MergeFinder
from modelvec.analyse.tree import TreeRule


def finder(rounding: float, seed: int = 0) -> tuple[MergeFinder, int]:
    """Two parents and a merge of them that a linear fit explains only in part (what trimming leaves) and that
    left far more entries as the base's than they did: the finder's trimmed path. ``rounding``: the expected
    size of the merge's rounding to its own precision (the base's scale 1)."""
    rng = np.random.default_rng(seed)
    p1, p2 = rng.normal(size=(2, 4000)) * 10 / np.sqrt(4000)
    noise = rng.normal(size=4000)
    merge = 0.5 * p1 + 0.5 * p2 + 4.0 * noise / np.linalg.norm(noise)
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
