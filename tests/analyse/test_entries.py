"""A trimmed merge fitted entry by entry (:mod:`modelvec.analyse.tree.entries`), on matrices merged by mergekit's own
merge methods (its DARE drop and l1 rescale, TIES' magnitude trim, the sign election, ``normalize``), computed in
the merge's dtype as mergekit computes it: each DARE or TIES merge is named with exactly its parents and its
method, at any density, weights and dtype; no fine-tune, sibling, child, linear merge or parent of merges is."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from modelvec.analyse.tree.entries import GROUP, EntryFit

# The merges are mergekit's own (a dev tool, not a dependency: `make test-floors` runs without it).
pytest.importorskip("mergekit")

MATRICES, SHAPE, KEPT = 8, (192, 256), 256  # 2,048 entries kept, as a trace keeps at least


def merged(method: str, base, parents, weights, density: float, normalize: bool, dtype, seed: int) -> torch.Tensor:
    """One matrix merged by mergekit's ``method`` (its DARE drops seeded by ``seed``), in ``dtype``."""
    from mergekit.merge_methods import registry
    from mergekit.merge_methods.base import TensorGroup

    torch.manual_seed(seed)
    group = TensorGroup.from_tensors([base.to(dtype), *(p.to(dtype) for p in parents)], base_index=0)
    ids = [e.id for e in group.non_base]
    parameters = {
        "weight": dict(zip(ids, weights)),
        "density": dict.fromkeys(ids, density),
        "normalize": normalize,
        "rescale": method.startswith("dare"),
        "int8_mask": False,
        "lambda": 1.0,
    }
    return registry.get(method).merge_group(group, **parameters)


class Zoo:
    """Fine-tunes of a bf16 base's matrices (``size`` of the mean weight per entry: 0.05 is many bf16 steps), the
    first two siblings on one dataset and a child of the first, and the entries a trace keeps of each model."""

    def __init__(self, size: float = 0.05, dtype=torch.bfloat16, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        rng = np.random.default_rng(seed)
        self.bases, self.models, self.at = [], {}, []
        for _ in range(MATRICES):
            base = (0.02 * torch.randn(SHAPE, generator=gen)).to(torch.bfloat16)
            shared, scale = torch.randn(SHAPE, generator=gen), size * base.float().abs().mean()
            steps = {f: torch.randn(SHAPE, generator=gen) for f in ("a", "b", "c", "d", "e", "sibling")}
            steps["a"], steps["sibling"] = (steps["a"] + 1.5 * shared) / 1.8, (steps["sibling"] + 1.5 * shared) / 1.8
            for name, step in steps.items():
                self.models.setdefault(name, []).append((base.float() + scale * step).to(dtype))
            child = self.models["a"][-1].float() + 0.5 * scale * torch.randn(SHAPE, generator=gen)
            self.models.setdefault("child", []).append(child.to(dtype))
            self.bases.append(base)
            starts = rng.choice(base.numel() // GROUP, KEPT // GROUP, replace=False) * GROUP
            self.at.append((starts[:, None] + np.arange(GROUP)).reshape(-1))
        self.tuned = list(self.models)

    def merge(self, name: str, method: str, pair, weights, density=1.0, normalize=True, dtype=torch.bfloat16) -> str:
        seed = len(self.models)
        self.models[name] = [
            merged(method, b, [self.models[p][k] for p in pair], weights, density, normalize, dtype, seed + 97 * k)
            for k, b in enumerate(self.bases)
        ]
        return name

    def fit(self, least: float = 0.05) -> tuple[EntryFit, dict[str, int]]:
        """The entry fit over every model so far, and each model's row."""
        flat = lambda tensors: np.concatenate([t.double().reshape(-1).numpy()[at] for t, at in zip(tensors, self.at)])
        base = flat(self.bases)
        names = list(self.models)
        entries = np.stack([flat(self.models[n]) - base for n in names]).astype(np.float32)
        precision = [str(self.models[n][0].dtype).removeprefix("torch.") for n in names]
        return EntryFit(entries, base, precision, least), {n: i for i, n in enumerate(names)}


def found(fit: EntryFit, rows: dict[str, int], model: str, candidates) -> tuple[set[str], str] | None:
    names = {i: n for n, i in rows.items()}
    result = fit.fit(rows[model], [rows[c] for c in candidates if c != model])
    return None if result is None else ({names[p] for p in result.parents}, result.method)


#: DARE merges: (method, density, weights, normalize), each saved in float32 and in bf16. DARE-linear at 0.9 is
#: left out: no sign election adds entries one parent holds alone, 9 % of them, and ``normalize`` scales them to a
#: few bf16 steps (found in float32 only; docs/tree.md).
DARE = [
    (method, density, weights, normalize)
    for method, densities in (("dare_ties", (0.6, 0.75, 0.9)), ("dare_linear", (0.6, 0.75)))
    for density in densities
    for weights, normalize in (((0.5, 0.5), True), ((0.3, 0.7), True), ((1.0, 1.0), False))
]


@pytest.fixture(scope="module")
def zoo() -> tuple[Zoo, list[tuple[str, set[str], str]]]:
    """The zoo with every merge of the tests below, each of a pair of its own where the pairs allow."""
    z = Zoo()
    pairs = itertools.cycle(itertools.combinations(["a", "b", "c", "d", "e"], 2))
    made = []
    for (method, density, weights, normalize), dtype in itertools.product(DARE, (torch.float32, torch.bfloat16)):
        pair = next(pairs)
        name = z.merge(
            f"{method}-{density}-{weights}-{normalize}-{dtype}", method, pair, weights, density, normalize, dtype
        )
        made.append((name, set(pair), "dare"))
    for density, dtype in itertools.product((0.5, 0.8), (torch.float32, torch.bfloat16)):
        pair = next(pairs)
        made.append(
            (z.merge(f"ties-{density}-{dtype}", "ties", pair, (0.3, 0.7), density, True, dtype), set(pair), "ties")
        )
    return z, made


def test_every_dare_and_ties_merge_is_named_with_exactly_its_parents_and_method(zoo):
    """Whatever the density, weights, ``normalize`` and dtype: the candidates are every fine-tune (a sibling and a
    child of one parent among them)."""
    z, made = zoo
    fit, rows = z.fit()
    wrong = {name: found(fit, rows, name, z.tuned) for name, parents, method in made}
    wrong = {n: f for (n, parents, method), f in zip(made, wrong.values()) if f != (parents, method)}
    assert wrong == {}


def test_a_merge_fitted_on_the_wrong_models_is_none(zoo):
    """Without one of its parents among the candidates, a DARE merge is no merge of the others (a sibling of the
    missing parent does not stand for it)."""
    z, made = zoo
    fit, rows = z.fit()
    for name, parents, _ in made[:8]:
        missing = sorted(parents)[0]
        assert found(fit, rows, name, [c for c in z.tuned if c != missing]) is None, name


def test_fine_tunes_siblings_children_and_weighted_averages_are_no_entry_merges(zoo):
    """A direct fine-tune, a sibling, a child, a linear merge and a task arithmetic merge hold no parent's delta
    exactly on entries others dropped: none is an entry merge, whatever its candidates (merges among them)."""
    z, made = zoo
    averages = [
        z.merge("linear", "task_arithmetic", ("a", "b"), (0.5, 0.5), normalize=False, dtype=torch.float32),
        z.merge("task", "task_arithmetic", ("c", "d"), (0.6, 0.6), normalize=False),
    ]
    fit, rows = z.fit()
    everyone = list(z.models)
    name, parents, method = made[1]  # the same candidates find a merge among them
    assert found(fit, rows, name, everyone) == (parents, method)
    for name in [*z.tuned, *averages]:
        assert found(fit, rows, name, everyone) is None, name
    for name in z.tuned:  # its trimmed merges alone: each holds the entries it kept, none their sum
        assert found(fit, rows, name, [n for n, _, _ in made]) is None, name


def test_chance_matches_of_deltas_a_few_bf16_steps_long_name_no_merge():
    """Fine-tunes one or three bf16 steps from the base agree entry by entry often (a ratio of small integers): no
    fine-tune is named a merge, nor a linear merge of them a trimmed one."""
    for size in (0.005, 0.012):
        z = Zoo(size=size, seed=1)
        z.merge("linear", "task_arithmetic", ("a", "b"), (0.5, 0.5), normalize=False)
        z.merge("dense", "dare_ties", ("c", "d"), (0.5, 0.5), density=0.9)
        fit, rows = z.fit()
        for name in [*z.tuned, "linear"]:
            assert found(fit, rows, name, list(z.models)) is None, (size, name)


def test_a_three_way_dare_merge_finds_all_three_parents():
    z = Zoo(seed=2)
    z.merge("three", "dare_ties", ("b", "c", "d"), (1 / 3, 1 / 3, 1 / 3), density=0.6, dtype=torch.float32)
    fit, rows = z.fit()
    assert found(fit, rows, "three", z.tuned) == ({"b", "c", "d"}, "dare")


def test_entries_that_cannot_tell_fit_nothing(zoo):
    """A model without kept entries, of an unknown dtype, or whose candidates keep none: no fit."""
    z, made = zoo
    fit, rows = z.fit()
    name, parents, _ = made[0]
    fit.entries[rows[sorted(parents)[0]]] = np.nan
    assert found(fit, rows, name, z.tuned) is None
    unknown = EntryFit(fit.entries, fit.b, [None] * len(fit.precision), fit.least)
    assert unknown.fit(rows[made[1][0]], [rows[c] for c in z.tuned]) is None
