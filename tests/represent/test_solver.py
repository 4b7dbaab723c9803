"""The randomized SVD solver: on planted low-rank deltas of tiny real models (tests/tiny_families.py), its vector is
the definition's, computed from the modules with a float64 exact SVD, to 1e-3."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_families import embed, reference_vector


@pytest.mark.parametrize("name", ["bert-cls", "gpt2-lm", "llama-lm"])
def test_randomized_solver_matches_reference_on_low_rank_deltas(zoo, name):
    case = zoo.case(name)
    _, vec = embed(case, rank=4, solver="randomized")
    np.testing.assert_allclose(vec, reference_vector(case.spec, case.base, case.ft, 4), atol=1e-3, rtol=0)
