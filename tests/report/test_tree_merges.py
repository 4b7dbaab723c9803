"""Merges as the Hub makes them: real mergekit merges (linear, task arithmetic, TIES, DARE-TIES, SLERP, a three-way
linear) of fine-tunes of a tiny Llama, saved in bf16 as merges are published, each named a merge with exactly its
parents and, where the weights tell it, its method; beside them direct fine-tunes are never merges, a fine-tune
whose sibling was merged keeps its own parent, and a fine-tune of a merge is placed under it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import modelvec
from builders import trained
from modelvec.report.tree import model_tree


def mergekit(
    out: Path,
    method: str,
    models: list[tuple[Path, dict]],
    base: Path | None,
    dtype: str = "bfloat16",
    seed: int | None = None,
    **parameters,
) -> Path:
    """A merge made by mergekit itself, saved in ``dtype`` (bf16, as merges are published; ``seed``: DARE's drops)."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    config: dict = {
        "merge_method": method,
        "dtype": dtype,
        "models": [{"model": str(m), **({"parameters": p} if p else {})} for m, p in models],
    }
    if base is not None:
        config["base_model"] = str(base)
    if parameters:
        config["parameters"] = parameters
    options = MergeOptions(copy_tokenizer=False, quiet=True, random_seed=seed)
    run_merge(MergeConfiguration.model_validate(config), str(out), options)
    return out


def lora(parent: Path, out: Path) -> Path:
    """A peft LoRA adapter of the Llama in ``parent`` on q_proj and v_proj (its config names ``parent``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(7)
    model = get_peft_model(
        LlamaForCausalLM.from_pretrained(parent, dtype=torch.float32),
        LoraConfig(init_lora_weights=False, r=4, target_modules=["q_proj", "v_proj"]),
    )
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tree(llama_family, tmp_path_factory):
    base, a, b, c = llama_family
    root = tmp_path_factory.mktemp("merges")
    sibling = trained(base, root / "a-sibling", [1], 14)  # a's dataset, its own seed
    half = {"weight": 0.5, "density": 0.5}
    merges = {
        "linear": mergekit(root / "linear", "linear", [(a, {"weight": 0.5}), (b, {"weight": 0.5})], None),
        # mostly a: nearer a's sibling than the base is, and holding 0.8 of a's direction, as a child would
        "linear82": mergekit(root / "linear82", "linear", [(a, {"weight": 0.8}), (b, {"weight": 0.2})], None),
        "linear3": mergekit(root / "linear3", "linear", [(m, {"weight": 1.0}) for m in (a, b, c)], None),
        "task_arithmetic": mergekit(
            root / "task_arithmetic", "task_arithmetic", [(a, {"weight": 0.6}), (b, {"weight": 0.6})], base
        ),
        "ties": mergekit(root / "ties", "ties", [(a, half), (b, half)], base, normalize=True),
        "dare_ties": mergekit(root / "dare_ties", "dare_ties", [(a, half), (b, half)], base, normalize=True),
        "slerp": mergekit(root / "slerp", "slerp", [(a, {}), (c, {})], a, t=0.5),
    }
    child = trained(merges["linear"], root / "linear-child", [4], 15)  # a fine-tune of a merge
    adapter = lora(base, root / "lora-on-base")
    models = [a, b, c, sibling, *merges.values(), child, adapter]
    store = root / "s.duckdb"
    result = modelvec.embed(base, models, store=store, load=False)
    assert result.failed == {}
    found = model_tree(base, store=store)
    return {Path(n.model).name: n for n in found.nodes}, {Path(n.model).name: n.model for n in found.nodes}


@pytest.mark.parametrize(
    "merge,parents,method",
    [
        ("linear", {"a", "b"}, "linear"),
        ("linear3", {"a", "b", "c"}, "linear"),
        ("linear82", {"a", "b"}, "linear"),
        ("task_arithmetic", {"a", "b"}, "task_arithmetic"),
        ("ties", {"a", "b"}, "ties"),
        ("dare_ties", {"a", "b"}, "dare"),
        ("slerp", {"a", "c"}, "slerp"),
    ],
)
def test_a_mergekit_merge_is_named_a_merge_of_exactly_its_parents(tree, merge, parents, method):
    nodes, _ = tree
    node = nodes[merge]
    assert node.kind == "merge" and {Path(p).name for p in node.parents} == parents, (node.kind, node.parents)
    assert node.method == method
    assert node.as_json()["method"] == method


def test_direct_fine_tunes_are_never_merges_and_a_merge_steals_no_parent(tree):
    nodes, _ = tree
    for name in ("a", "b", "c", "a-sibling"):  # a-sibling shares a's direction, which two merges hold in part
        assert nodes[name].kind == "fine-tune" and nodes[name].parents == [nodes[name].parent], name
        assert Path(nodes[name].parent).name == "base", (name, nodes[name].parent)
    child = nodes["linear-child"]
    assert child.kind == "fine-tune" and Path(child.parent).name == "linear"
    adapter = nodes["lora-on-base"]  # its config names the base: so is its parent, whatever merges stand near
    assert adapter.kind == "adapter" and Path(adapter.parent).name == "base" and adapter.confidence == 1.0


def test_a_card_naming_a_merges_parents_is_checked_by_the_weights(tree, tmp_path):
    """A merge whose card names its parents is fitted on them first; a card naming the wrong parents is flagged."""
    nodes, names = tree
    root, linear = Path(names["a"]).parent, Path(names["linear"])
    store = tmp_path / "s.duckdb"
    shutil.copytree(linear, tmp_path / "declared")
    shutil.copytree(linear, tmp_path / "misdeclared")
    (tmp_path / "declared" / "README.md").write_text(f"---\nbase_model: {json.dumps([names['a'], names['b']])}\n---\n")
    (tmp_path / "misdeclared" / "README.md").write_text(
        f"---\nbase_model: {json.dumps([names['a'], names['c']])}\n---\n"
    )
    weights = tmp_path / "declared" / "model.safetensors"  # not a copy of linear: one value of a matrix read moved
    state = load_file(str(weights))
    key = next(k for k in state if k.endswith("q_proj.weight"))
    state[key][0, 0] += 0.01
    save_file(state, str(weights), metadata={"format": "pt"})
    modelvec.embed(root / "base", [root / m for m in ("a", "b", "c")] + [tmp_path / "declared"], store=store)
    modelvec.embed(root / "base", [tmp_path / "misdeclared"], store=store)
    found = {Path(n.model).name: n for n in model_tree(root / "base", store=store).nodes}
    assert found["declared"].kind == "merge" and found["declared"].agrees
    assert {Path(p).name for p in found["declared"].parents} == {"a", "b"}
    assert found["misdeclared"].kind == "merge" and not found["misdeclared"].agrees


#: DARE merges across density, weights and saved dtype: (method, density, (weights, normalize), dtype, parents), each
#: of a pair of the five fine-tunes of its own (merges sharing a pair are each other's near-duplicates).
DARE = [
    ("dare_ties", 0.3, ((0.5, 0.5), True), "bfloat16", ("a", "b")),
    ("dare_ties", 0.3, ((0.3, 0.7), True), "float32", ("a", "c")),
    ("dare_ties", 0.45, ((1.0, 1.0), False), "bfloat16", ("b", "c")),
    ("dare_ties", 0.6, ((0.5, 0.5), True), "float32", ("a", "d")),
    ("dare_ties", 0.6, ((0.5, 0.5), True), "bfloat16", ("b", "d")),
    ("dare_ties", 0.6, ((0.3, 0.7), True), "bfloat16", ("c", "d")),
    ("dare_ties", 0.45, ((0.3, 0.7), True), "bfloat16", ("a", "e")),
    ("dare_ties", 0.3, ((1.0, 1.0), False), "float32", ("b", "e")),
    ("dare_linear", 0.6, ((0.3, 0.7), True), "float32", ("c", "e")),
    ("dare_linear", 0.45, ((0.5, 0.5), True), "bfloat16", ("d", "e")),
    # dense DARE: few entries dropped by every parent, the merge's trace as a fine-tune's on another dataset
    ("dare_ties", 0.75, ((0.5, 0.5), True), "float32", ("a", "f")),
    ("dare_ties", 0.75, ((0.5, 0.5), True), "bfloat16", ("b", "f")),
    ("dare_ties", 0.75, ((0.3, 0.7), True), "float32", ("c", "f")),
    ("dare_ties", 0.75, ((0.3, 0.7), True), "bfloat16", ("d", "f")),
    ("dare_ties", 0.9, ((0.5, 0.5), True), "float32", ("e", "f")),
    ("dare_ties", 0.9, ((0.5, 0.5), True), "bfloat16", ("a", "g")),
    ("dare_ties", 0.9, ((0.3, 0.7), True), "float32", ("b", "g")),
    ("dare_ties", 0.9, ((0.3, 0.7), True), "bfloat16", ("c", "g")),
    ("dare_ties", 0.6, ((0.3, 0.7), True), "float32", ("d", "g")),
    ("dare_ties", 0.75, ((1.0, 1.0), False), "bfloat16", ("e", "g")),
    ("dare_ties", 0.9, ((1.0, 1.0), False), "float32", ("f", "g")),
]


def dare_name(method: str, density: float, weights: tuple[float, float], dtype: str) -> str:
    return f"{method}-{density}-{weights[0]}-{weights[1]}-{dtype}"


@pytest.fixture(scope="module")
def dare(llama_family, tmp_path_factory):
    """A population of seven long fine-tunes (and a sibling of one) and the DARE merges of :data:`DARE`, each built
    once: the tree's nodes by folder name."""
    base, a, b, c = llama_family
    root = tmp_path_factory.mktemp("dare")
    more = {n: trained(base, root / n, [d], s) for n, d, s in (("d", 5, 16), ("e", 6, 17), ("f", 7, 18), ("g", 8, 19))}
    tuned = {"a": a, "b": b, "c": c, **more}
    sibling = trained(base, root / "a-sibling", [1], 14)
    merges = []
    for k, (method, density, (weights, normalize), dtype, pair) in enumerate(DARE):
        models = [(tuned[p], {"weight": w, "density": density}) for p, w in zip(pair, weights)]
        out = root / dare_name(method, density, weights, dtype)
        merges.append(mergekit(out, method, models, base, dtype=dtype, seed=k, normalize=normalize))
    store = root / "s.duckdb"
    assert modelvec.embed(base, [*tuned.values(), sibling, *merges], store=store, load=False).failed == {}
    return {Path(n.model).name: n for n in model_tree(base, store=store).nodes}


@pytest.mark.parametrize(
    "method,density,weights,dtype,parents",
    [(m, d, w, t, p) for m, d, (w, _), t, p in DARE],
    ids=[dare_name(m, d, w, t) for m, d, (w, _), t, _ in DARE],
)
def test_a_dare_merge_is_a_merge_of_both_parents_at_any_density_weights_and_dtype(
    dare, method, density, weights, dtype, parents
):
    """DARE drops each parent's entries at random and rescales the rest by 1/density: the merge's trace is its
    parents' sum (times about 1 - density/2) plus a noise that grows as density falls, and no combination
    explains; the entries every parent dropped are left as the base's."""
    node = dare[dare_name(method, density, weights, dtype)]
    assert node.kind == "merge", (node.kind, node.parents)
    assert {Path(p).name for p in node.parents} == set(parents), node.parents
    assert node.method == "dare"


def test_beside_dare_merges_direct_fine_tunes_stay_fine_tunes_of_the_base(dare):
    for name in ("a", "b", "c", "d", "e", "f", "g", "a-sibling"):
        assert dare[name].kind == "fine-tune" and Path(dare[name].parent).name == "base", (name, dare[name].parents)
