"""A share of rows and the sketch's projections: which rows are read, that only they are read, and what the
projections estimate (the unbiased mean over layers, CountSketch as its definition, fused tensors as their parts)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from builders import llama_pair, save_state
from modelvec import DeltaEmbedder, Representation
from modelvec.read import Checkpoint, MatrixRef, Orientation
from modelvec.read.headers import header_of, row_bytes
from modelvec.represent.plans import (
    MIN_BLOCKS,
    MIN_READ_ELEMS,
    READ_BLOCK_ELEMS,
    derived_seed,
    plan_matrix,
    select_rows,
)
from modelvec.represent.projection import Projection

NAN_BF16 = b"\xc0\x7f"  # bf16 NaN, little-endian


def _weights(**fields):
    """A representation of the weights' own sketch: these checkpoints are matrices only, no model to run on the
    probe (``probe="auto"`` takes it for the Llama family)."""
    return Representation(probe="none", **fields)


def test_row_selection_is_deterministic_spread_and_keyed_by_place():
    a = select_rows(4096, 2048, 0.05, 0, ("decoder", 3, "q"))
    assert a == select_rows(4096, 2048, 0.05, 0, ("decoder", 3, "q"))  # the same for every model and the base
    assert a != select_rows(4096, 2048, 0.05, 0, ("decoder", 4, "q"))  # each layer its own rows
    assert a != select_rows(4096, 2048, 0.05, 1, ("decoder", 3, "q"))  # and each seed
    chosen = sum(b - s for s, b in a)
    assert math.ceil(0.05 * 4096) <= chosen < math.ceil(0.05 * 4096) + MIN_BLOCKS
    assert all(0 <= s < b <= 4096 for s, b in a) and list(a) == sorted(a)
    assert all(b1 < s2 for (_, b1), (s2, _) in itertools.pairwise(a))  # merged where they touch
    assert select_rows(384, 384, 1.0, 0, ("x",)) == ((0, 384),)
    assert sum(b - s for s, b in select_rows(40, 384, 0.02, 0, ("x",))) == 1  # at least one row


@pytest.mark.parametrize("n_rows, row_elems, share", [(14336, 4096, 0.05), (4096, 4096, 0.02), (576, 576, 0.05)])
def test_row_blocks_are_sized_for_reads(n_rows, row_elems, share):
    """Blocks of 64 KiB to 1 MiB of bf16, spread over several places where the share is large enough."""
    ranges = select_rows(n_rows, row_elems, share, 0, ("decoder", 0, "ff1"))
    want = math.ceil(share * n_rows)
    unit = min(b - s for s, b in ranges)  # one block (neighbours drawn together are merged into one range)
    assert all(s % unit == 0 and (b - s) % unit == 0 for s, b in ranges)
    assert unit * row_elems <= READ_BLOCK_ELEMS
    assert unit * row_elems >= MIN_READ_ELEMS or unit >= want  # a small share is one block
    blocks = sum(b - s for s, b in ranges) // unit
    assert blocks >= min(MIN_BLOCKS, want * row_elems // MIN_READ_ELEMS)


def _ref(family, orientation=Orientation.LINEAR, part=0, n_parts=1, fused=None, weights=None):
    return MatrixRef(
        stack="decoder",
        layer=2,
        family=family,
        tensor=f"layers.2.{family}.weight",
        orientation=orientation,
        part=part,
        n_parts=n_parts,
        fused=fused,
        weights=weights,
    )


def test_fused_linear_parts_choose_rows_as_unfused_matrices_of_their_family():
    """Phi-3's qkv_proj (q | k | v along the stored rows): each part reads the rows Llama's q_proj, k_proj
    and v_proj of the same sizes read, offset into the fused tensor."""
    params = _weights(rows=0.1, projection="countsketch")
    sizes = (64, 16, 16)
    start = 0
    for part, (family, size) in enumerate(zip("qkv", sizes)):
        fused = plan_matrix(_ref(family, part=part, n_parts=3, fused="qkv", weights=(4, 1, 1)), (96, 32), params)
        alone = plan_matrix(_ref(family), (size, 32), params)
        assert fused.row_ranges == tuple((start + a, start + b) for a, b in alone.row_ranges)
        assert (fused.row_start, fused.n_rows, fused.cols) == (start, size, (0, 32))
        assert fused.local_rows().tolist() == alone.local_rows().tolist()
        start += size


def test_fused_conv1d_parts_share_one_choice_of_rows():
    """GPT-2's c_attn (q | k | v along the stored columns): the parts read the same rows, the tensor's."""
    params = _weights(rows=0.1)
    plans = [
        plan_matrix(_ref(f, Orientation.CONV1D, part=i, n_parts=3, fused="qkv"), (64, 192), params)
        for i, f in enumerate("qkv")
    ]
    assert plans[0].row_ranges == plans[1].row_ranges == plans[2].row_ranges
    assert [p.cols for p in plans] == [(0, 64), (64, 128), (128, 192)]
    assert plans[0].row_ranges == select_rows(64, 192, 0.1, 0, ("decoder", 2, "qkv"))


def _poisoned_copy(ck_folder, out, keep: dict[str, list[tuple[int, int]]]):
    """A copy of a one-file safetensors checkpoint whose bytes are bf16 NaN everywhere but its header and the
    given stored rows of each tensor: reading anything else puts NaN in the vector."""
    out.mkdir()
    (out / "config.json").write_text((ck_folder / "config.json").read_text())
    raw = bytearray((ck_folder / "model.safetensors").read_bytes())
    start, header = header_of(ck_folder / "model.safetensors")
    poisoned = bytearray(raw[:start]) + NAN_BF16 * ((len(raw) - start) // 2)
    for name, ranges in keep.items():
        for a, b in row_bytes(header[name], ranges):
            poisoned[start + a : start + b] = raw[start + a : start + b]
    (out / "model.safetensors").write_bytes(bytes(poisoned))
    return out


@pytest.mark.parametrize("projection", ["shared", "gaussian", "countsketch"])
def test_a_share_of_rows_reads_only_those_rows(tmp_path, projection):
    """The vector from files that hold only the selected rows (NaN elsewhere) equals the vector from whole files:
    nothing else was read, for the base at fit nor for the fine-tune."""
    base, ft = llama_pair(tmp_path, 64, 192, 2, torch.bfloat16)
    params = _weights(rows=0.1, projection=projection, pooling="concat")
    whole = DeltaEmbedder(params).fit(base)
    expected = whole.embed_one(ft)
    keep: dict[str, list[tuple[int, int]]] = {}
    for plan in whole.plans_.values():
        keep.setdefault(plan.tensor, []).extend(plan.row_ranges)
    assert sum(b - a for a, b in keep["model.layers.0.mlp.up_proj.weight"]) < 192  # a share, not all
    poisoned = DeltaEmbedder(params).fit(_poisoned_copy(base, tmp_path / "pb", keep))
    got = poisoned.embed_one(_poisoned_copy(ft, tmp_path / "pf", keep))
    np.testing.assert_array_equal(got, expected)
    assert np.isfinite(got).all() and np.abs(got).sum() > 0


@pytest.mark.parametrize("projection", ["gaussian", "countsketch"])
def test_partial_reads_equal_the_same_rows_of_a_full_read(tmp_path, projection):
    """Each block is the projection of exactly the selected rows of the delta, formed from a full in-memory read."""
    base, ft = llama_pair(tmp_path, 64, 192, 2, torch.bfloat16)
    params = _weights(rows=0.25, projection=projection, pooling="concat", block_norm=False)
    e = DeltaEmbedder(params).fit(base)
    vec = e.embed_one(ft)
    b, f = load_file(str(base / "model.safetensors")), load_file(str(ft / "model.safetensors"))
    for ref, block in zip(e.layout_.refs, e.blocks_):
        plan = e.plans_[ref.key]
        delta = f[plan.tensor].double() - b[plan.tensor].double()
        rows = torch.cat([delta[a:c] for a, c in plan.row_ranges])
        fresh = Projection(plan, params, (ref.stack, ref.layer, ref.family), torch.device("cpu"))
        acc = fresh.start()
        fresh.add(acc, rows.clone(), 0)
        np.testing.assert_allclose(vec[block.start : block.stop], fresh.finish(acc).numpy(), rtol=1e-5, atol=1e-9)


def test_countsketch_is_its_definition():
    """Entry (i, j) of the selected rows goes to bucket (h_r(i) + h_c(j)) mod D with sign s_r(i) s_c(j)."""
    ref = _ref("q")
    params = _weights(rows=0.5, projection="countsketch", rank=2)
    plan = plan_matrix(ref, (12, 5), params)
    p = Projection(plan, params, ("decoder", 2, "q"), torch.device("cpu"))
    x = torch.randn(plan.n_selected, 5, dtype=torch.float64)
    acc = p.start()
    p.add(acc, x.clone(), 0)
    got = p.finish(acc)
    size = 2 * plan.kept
    expected = torch.zeros(size, dtype=torch.float64)
    for i in range(x.shape[0]):
        for j in range(5):
            expected[(int(p.h_row[i]) + int(p.h_col[j])) % size] += float(p.s_row[i] * p.s_col[j]) * x[i, j]
    torch.testing.assert_close(got, expected)


def _cross_layer_pair(tmp_path, n_layers=2):
    """Two fine-tunes whose deltas sit in different layers: model A's layer-0 delta is model B's layer-1 delta.

    Their concatenated task vectors are orthogonal; a mean over layers with one projection for all layers
    sees them as the same model."""
    base, _ = llama_pair(tmp_path / "src", 32, 64, n_layers, torch.float32)
    state = load_file(str(base / "model.safetensors"))
    config = json.loads((base / "config.json").read_text())
    gen = torch.Generator().manual_seed(1)
    deltas = {k: torch.randn(v.shape, generator=gen) * 0.01 for k, v in state.items() if ".layers.0." in k}
    a = {k: v + deltas.get(k, 0) for k, v in state.items()}
    b = {
        k: v + deltas.get(k.replace(".layers.1.", ".layers.0."), 0) if ".layers.1." in k else v
        for k, v in state.items()
    }
    return base, save_state(tmp_path / "a", a, config), save_state(tmp_path / "b", b, config)


def test_a_mean_over_layers_with_independent_projections_is_unbiased(tmp_path):
    """The cross-layer terms have expectation zero with an Omega per layer and matrix (gaussian) or a CountSketch
    per block: over seeds, the mean's inner product of two models whose deltas sit in different layers averages
    to their concatenated inner product, 0. One Omega for all layers (shared) makes them near-identical."""
    base, a, b = _cross_layer_pair(tmp_path)

    def cosines(projection: str, seeds: range) -> np.ndarray:
        out = []
        for seed in seeds:
            e = DeltaEmbedder(projection=projection, rows=1, seed=seed, block_norm=False, probe="none").fit(base)
            x, y = e.embed_one(a).astype(np.float64), e.embed_one(b).astype(np.float64)
            out.append(x @ y / np.linalg.norm(x) / np.linalg.norm(y))
        return np.array(out)

    shared = cosines("shared", range(3))
    assert (shared > 0.99).all()  # the same delta in another layer: seen as the same model
    for projection in ("gaussian", "countsketch"):
        c = cosines(projection, range(40))
        assert abs(c.mean()) < 3 * c.std() / np.sqrt(len(c)) + 0.01  # expectation 0
        assert c.std() > 0.0  # not identically zero: it is an estimate
        assert np.abs(c).max() < 0.5


def test_projections_are_independent_across_layers_and_matrices():
    params = Representation(projection="gaussian", rows=1)
    plan = plan_matrix(_ref("q"), (64, 32), params)
    one = Projection(plan, params, ("decoder", 0, "q"), torch.device("cpu")).omega_t
    two = Projection(plan, params, ("decoder", 1, "q"), torch.device("cpu")).omega_t
    assert not torch.equal(one, two)
    shared = Representation(projection="shared", rows=1)
    assert torch.equal(
        Projection(plan, shared, ("decoder", 0, "q"), torch.device("cpu")).omega_t,
        Projection(plan, shared, ("decoder", 1, "q"), torch.device("cpu")).omega_t,
    )
    assert derived_seed(0, "a", 1) == derived_seed(0, "a", 1) != derived_seed(0, "a", 2)


def _phi3_from_llama(llama: Path, out: Path) -> Path:
    state = load_file(str(llama / "model.safetensors"))
    config = json.loads((llama / "config.json").read_text())
    fused = {}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        fused[p + "self_attn.qkv_proj.weight"] = torch.cat([state[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        fused[p + "self_attn.o_proj.weight"] = state[p + "self_attn.o_proj.weight"]
        fused[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
        )
        fused[p + "mlp.down_proj.weight"] = state[p + "mlp.down_proj.weight"]
    return save_state(out, fused, {**config, "model_type": "phi3"})


@pytest.mark.parametrize("projection", ["gaussian", "countsketch", "shared"])
def test_a_fused_checkpoint_reads_and_gives_what_its_split_parts_do(tmp_path, projection):
    """Phi-3's fused qkv_proj and gate_up_proj select rows part by part, as Llama's separate matrices do: the same
    weights stored fused or split give the same vector (the row share, the projections and the blocks agree)."""
    base, ft = llama_pair(tmp_path / "llama", 64, 96, 2, torch.bfloat16)
    fbase, fft = _phi3_from_llama(base, tmp_path / "pb"), _phi3_from_llama(ft, tmp_path / "pf")
    params = _weights(rows=0.2, projection=projection, pooling="concat")
    split = DeltaEmbedder(params).fit(base).embed_one(ft)
    fused = DeltaEmbedder(params).fit(fbase).embed_one(fft)
    np.testing.assert_allclose(fused, split, rtol=1e-6, atol=1e-7)


def test_gpt2_c_attn_parts_project_the_shared_rows_of_their_columns(tmp_path):
    """GPT-2's Conv1D c_attn: each part's block is the projection of its columns of the selected rows."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16)
    base_model = GPT2LMHeadModel(cfg)
    base_model.save_pretrained(tmp_path / "base")
    with torch.no_grad():
        for p in base_model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    base_model.save_pretrained(tmp_path / "ft")
    params = _weights(rows=0.3, projection="countsketch", pooling="concat", block_norm=False)
    e = DeltaEmbedder(params).fit(tmp_path / "base")
    vec = e.embed_one(tmp_path / "ft")
    b, f = (
        load_file(str(tmp_path / "base" / "model.safetensors")),
        load_file(str(tmp_path / "ft" / "model.safetensors")),
    )
    checked = 0
    for ref, block in zip(e.layout_.refs, e.blocks_):
        if ref.fused != "qkv":
            continue
        plan = e.plans_[ref.key]
        name = plan.tensor
        delta = f[name].double() - b[name].double()  # [in, 3 out]
        rows = torch.cat([delta[a:c, plan.cols[0] : plan.cols[1]] for a, c in plan.row_ranges])
        p = Projection(plan, params, (ref.stack, ref.layer, ref.family), torch.device("cpu"))
        acc = p.start()
        p.add(acc, rows.clone(), 0)
        np.testing.assert_allclose(vec[block.start : block.stop], p.finish(acc).numpy(), rtol=1e-5, atol=1e-9)
        checked += 1
    assert checked == 6  # q, k, v of both layers


def test_rows_is_in_the_key_and_whole_for_svd_factors():
    # what was stored before rows and projections keeps its key
    assert Representation(rank=8, rows=1, projection="shared", head="none").key() == "r8-sketch-mean-seed0-bn"
    assert Representation().key() != "r8-sketch-mean-seed0-bn"  # a changed default is a new key
    keys = {
        Representation(rows=r, projection=p).key()
        for r in (1, 0.5, 0.05, "auto")
        for p in ("shared", "gaussian", "countsketch")
    }
    assert len(keys) == 12
    assert Representation(rows=1).key() == Representation(rows=1.0).key()
    assert Representation(factor="U", rows=0.5) == Representation(factor="U", rows=1)  # SVD: whole matrices
    assert Representation(factor="U").rows == 1.0 and "rows" not in Representation(factor="US").key()
    with pytest.raises(ValueError, match=r"rows must be a number in \(0, 1\]"):
        Representation(rows=1.5)
    assert Representation(factor="U", projection="countsketch").key() == Representation(factor="U").key()


def test_a_partial_download_refuses_rows_it_does_not_hold(tmp_path):
    """A folder marked as a partial download (the Hub path) serves only the byte ranges it lists."""
    from modelvec.core.errors import CheckpointError
    from modelvec.core.files import PARTIAL

    base, ft = llama_pair(tmp_path, 64, 128, 1, torch.bfloat16)
    params = _weights(rows=0.25, projection="countsketch")
    e = DeltaEmbedder(params).fit(base)
    expected = e.embed_one(ft)
    ck = Checkpoint(ft)
    rows = {p.tensor: p.row_ranges for p in e.plans_.values()}
    held = ck.byte_ranges(rows)
    (ft / PARTIAL).write_text(json.dumps({"files": {f.name: spans for f, spans in held.items()}}))
    np.testing.assert_array_equal(e.embed_one(ft), expected)
    other = DeltaEmbedder(_weights(rows=0.25, projection="countsketch", seed=5)).fit(base)
    with pytest.raises(CheckpointError, match="only some rows of model.safetensors were fetched"):
        other.embed_one(ft)
    with pytest.raises(CheckpointError, match="only some rows"):
        Checkpoint(ft).get_stored("model.layers.0.self_attn.q_proj.weight")


def test_vectors_of_another_representation_are_named_with_the_options_that_read_them(
    tiny_bert, tiny_finetunes, tmp_path
):
    """Vectors stored under another representation (an older default) are neither mixed in nor dropped: cluster
    and neighbors name them with the options that read them, and those options do."""
    from typer.testing import CliRunner

    from modelvec import embed
    from modelvec.cli import app
    from modelvec.core.settings import flags

    other = Representation(rank=4, projection="gaussian" if Representation().projection != "gaussian" else "shared")
    store = str(tmp_path / "s.duckdb")
    embed(tiny_bert, tiny_finetunes, representation=other, store=store)
    options = flags(other)
    cluster = ["cluster", str(tiny_bert), "--store", store, "--out", str(tmp_path / "o")]
    for command in (cluster, ["neighbors", str(tiny_finetunes[0]), "--store", store]):
        refused = CliRunner().invoke(app, command)
        said = " ".join(refused.output.split())
        assert refused.exit_code == 2 and other.key() in said and " ".join(options) in said, said
    shown = CliRunner().invoke(app, ["show", "--store", store, "--json"])
    assert json.loads(shown.output)["summary"][0]["params"] == other.key()
    found = CliRunner().invoke(app, ["neighbors", str(tiny_finetunes[0]), "--store", store, "--json", *options])
    assert found.exit_code == 0 and json.loads(found.output)["params"] == other.key()


def test_auto_rows_read_a_share_of_large_checkpoints_and_every_row_of_small_ones(tmp_path, monkeypatch):
    """``rows="auto"``: the share is decided by the size of the vector's matrices, from the shapes alone, so the
    base and its fine-tunes read the same rows; a small checkpoint reads every row, a large one the share."""
    from modelvec.represent import read_plan
    from modelvec.represent import representation as rep_module

    auto = _weights(rows="auto", auto_rows="share", pooling="concat")
    assert auto.row_budget(rep_module.AUTO_FROM - 1) == 1.0
    assert auto.row_budget(rep_module.AUTO_FROM) == rep_module.AUTO_SHARE
    assert Representation().row_budget(rep_module.AUTO_FROM) == rep_module.AUTO_ROWS  # a number of rows
    assert Representation(rows=0.1).row_budget(10**12) == 0.1 and Representation(rows=1).row_budget(1) == 1.0
    with pytest.raises(ValueError, match="share=representation.row_budget"):
        plan_matrix(
            MatrixRef(stack="decoder", layer=0, family="q", tensor="w", orientation=Orientation.LINEAR), (64, 32), auto
        )

    base, ft = llama_pair(tmp_path, 64, 192, 2, torch.bfloat16)
    small = DeltaEmbedder(auto).fit(base)
    values = sum(p.n_rows * p.n_cols for p in small.plans_.values())  # what the vector's matrices hold
    assert all(p.n_selected == p.n_rows for p in small.plans_.values())  # below the threshold: every row
    whole = DeltaEmbedder(_weights(rows=1, pooling="concat")).fit(base)
    np.testing.assert_array_equal(small.embed_one(ft), whole.embed_one(ft))
    counted = DeltaEmbedder(_weights(pooling="concat")).fit(base)  # the row budget: every row, as before
    np.testing.assert_array_equal(small.embed_one(ft), counted.embed_one(ft))

    monkeypatch.setattr(rep_module, "AUTO_FROM", values)  # as large as the threshold: the share
    large = DeltaEmbedder(auto).fit(base)
    share = DeltaEmbedder(_weights(rows=rep_module.AUTO_SHARE, pooling="concat")).fit(base)
    assert {k: p.row_ranges for k, p in large.plans_.items()} == {k: p.row_ranges for k, p in share.plans_.items()}
    assert sum(p.n_selected for p in large.plans_.values()) < sum(p.n_rows for p in large.plans_.values()) / 4
    assert read_plan(Checkpoint(ft), auto, base=False) == read_plan(Checkpoint(base), auto, base=False)
    np.testing.assert_array_equal(large.embed_one(ft), share.embed_one(ft))


def test_the_command_line_takes_a_share_or_auto(tmp_path):
    """``--rows`` takes a number or ``auto``, checked as the declaration says, in embed and in evaluate."""
    from typer.testing import CliRunner

    from modelvec.cli import app
    from modelvec.store import Store

    base, ft = llama_pair(tmp_path, 64, 192, 2, torch.bfloat16)
    store = str(tmp_path / "s.duckdb")
    for rows in ("auto", "0.5"):
        args = ["embed", str(ft), "--base", str(base), "--store", store, "--rows", rows, "--probe", "none"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    with Store(store, read_only=True) as db:
        keys = set(db.reads.summary()["params"])
    assert keys == {_weights(rows="auto").key(), _weights(rows=0.5).key()}
    for args in (["embed", str(ft), "--base", str(base)], ["evaluate", str(ft), "--base", str(base)]):
        bad = CliRunner().invoke(app, [*args, "--store", store, "--rows", "half"])
        said = " ".join(bad.output.replace("│", " ").split())
        assert bad.exit_code == 2 and "rows must be a number in (0, 1] or auto, not 'half'" in said, said
    assert "Traceback" not in bad.output


def test_a_row_budget_reads_that_many_rows_of_each_matrix_and_its_products_are_unbiased(tmp_path, monkeypatch):
    """``auto_rows``: a number of rows of each matrix of a large checkpoint (every row of a matrix that has fewer),
    the same rows for the base and its fine-tunes. Each row is read with probability budget / rows over seeds, so
    the sketched inner product of two fine-tunes is, in expectation over seeds, the exact one with each matrix's
    term weighted by that probability: the mean over 300 seeds is within four standard errors of it."""
    from modelvec.represent import read_plan
    from modelvec.represent import representation as rep_module

    monkeypatch.setattr(rep_module, "AUTO_FROM", 1)  # every checkpoint is large: the budget
    base, ft = llama_pair(tmp_path, 64, 128, 1, torch.float32)
    noise = torch.Generator().manual_seed(7)
    other = {
        k: v + torch.randn(v.shape, generator=noise) * 1e-3
        for k, v in load_file(str(base / "model.safetensors")).items()
    }
    ft2 = save_state(tmp_path / "ft2", other, json.loads((ft / "config.json").read_text()))
    budget, plain = 8, dict(auto_rows=8, pooling="concat", block_norm=False, head="none", size="none", probe="none")
    fitted = DeltaEmbedder(**plain).fit(base)
    assert all(p.n_selected == min(budget, p.n_rows) for p in fitted.plans_.values())
    assert read_plan(Checkpoint(ft), Representation(**plain), base=False) == read_plan(
        Checkpoint(base), Representation(**plain), base=False
    )
    exact, prefix = 0.0, fitted.layout_.prefix
    for ref in fitted.layout_.refs:
        rows = fitted.plans_[ref.key].n_rows
        a = Checkpoint(ft).matrix(ref, prefix) - Checkpoint(base).matrix(ref, prefix)
        b = Checkpoint(ft2).matrix(ref, prefix) - Checkpoint(base).matrix(ref, prefix)
        exact += min(budget, rows) / rows * float((a.double() * b.double()).sum())
    products = []
    for seed in range(300):
        e = DeltaEmbedder(**plain, seed=seed).fit(base)
        products.append(float(e.embed_one(ft).astype(np.float64) @ e.embed_one(ft2).astype(np.float64)))
    mean, stderr = np.mean(products), np.std(products) / np.sqrt(len(products))
    assert abs(mean - exact) < 4 * stderr, (mean, exact, stderr)
    assert np.std(products) > 0  # the seeds do draw different rows and sketches
