"""The store-backed pipeline, the CLI and the representation's determinism, on real computations."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import modelvec
from builders import planted_finetune, save_state
from modelvec import DeltaEmbedder, Representation, Store
from modelvec.cli import app
from modelvec.represent import canonical_signs, truncated_svd
from modelvec.store.views.export import export_parquet


def test_embed_stores_vectors_with_metadata(tiny_bert, tiny_finetunes, tmp_path):
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=store)
    assert sorted(result.embedded) == sorted(str(p.resolve()) for p in tiny_finetunes)
    assert result.vectors.shape == (3, DeltaEmbedder(rank=4).fit(tiny_bert).dim_)
    assert result.vectors.dtype == np.float32
    direct = DeltaEmbedder(rank=4).fit(tiny_bert).transform(sorted(tiny_finetunes))
    np.testing.assert_array_equal(result.vectors, direct)
    meta = result.metadata.set_index("model")
    assert list(meta.loc[str(tiny_finetunes[1].resolve()), "datasets"]) == ["glue/sst2"]
    assert list(meta.loc[str(tiny_finetunes[0].resolve()), "datasets"]) == ["imdb"]
    assert (meta["seconds"] > 0).all() and (meta["architecture"] == "bert").all()


def test_resume_skips_and_force_recomputes(tiny_bert, tiny_finetunes, tmp_path):
    store = tmp_path / "s.duckdb"
    first = modelvec.embed(tiny_bert, tiny_finetunes[:2], rank=4, store=store)
    assert len(first.embedded) == 2
    second = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=store)
    assert len(second.skipped) == 2 and second.embedded == [str(tiny_finetunes[2].resolve())]
    forced = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=store, force=True)
    assert len(forced.embedded) == 3 and not forced.skipped
    with Store(store) as db:
        assert len(db.reads.metadata()) == 3  # no duplicate rows
    other = modelvec.embed(tiny_bert, tiny_finetunes, rank=2, store=store)
    assert len(other.embedded) == 3  # another representation is another row
    with Store(store) as db:
        assert len(db.reads.metadata()) == 6


def test_a_representation_and_its_fields_given_together_are_one_setting(tiny_bert, tiny_finetunes, tmp_path):
    """``embed(representation=..., rank=...)``: a field the object leaves at its default is taken, one it sets and the
    keyword contradicts is refused in one line (the keywords were dropped without a word)."""
    store = tmp_path / "s.duckdb"
    merged = modelvec.embed(
        tiny_bert, tiny_finetunes[:1], representation=Representation(rank=4), pooling="concat", store=store
    )
    assert merged.metadata["params"].tolist() == [Representation(rank=4, pooling="concat").key()]
    with pytest.raises(ValueError, match=r"embed: rank=16 conflicts with Representation\(rank=4\)"):
        modelvec.embed(tiny_bert, tiny_finetunes[:1], representation=Representation(rank=4), rank=16, store=store)


def test_changed_weights_are_recomputed(tiny_bert, tmp_path):
    store = tmp_path / "s.duckdb"
    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=1)
    before = modelvec.embed(tiny_bert, [ft], rank=4, store=store).vectors
    shutil.rmtree(ft)
    planted_finetune(tiny_bert, ft, seed=2)
    again = modelvec.embed(tiny_bert, [ft], rank=4, store=store)
    assert again.embedded and not again.skipped
    assert not np.array_equal(again.vectors, before)
    with Store(store) as db:
        assert len(db.reads.metadata()) == 1


def test_a_failure_is_recorded_and_the_run_goes_on(tiny_bert, tiny_finetunes, tmp_path):
    store = tmp_path / "s.duckdb"
    broken = tmp_path / "broken"
    broken.mkdir()
    result = modelvec.embed(tiny_bert, [tiny_finetunes[0], broken, tiny_finetunes[1]], rank=4, store=store)
    assert len(result.embedded) == 2 and list(result.failed) == [str(broken.resolve())]
    with Store(store) as db:
        failures = db.reads.failures()
        assert failures["model"].tolist() == [str(broken.resolve())]
        assert "no weights found" in failures["error"][0]
    shutil.copytree(tiny_finetunes[2], broken, dirs_exist_ok=True)
    fixed = modelvec.embed(tiny_bert, [broken], rank=4, store=store)
    assert fixed.embedded and not fixed.failed
    with Store(store) as db:
        assert db.reads.failures().empty  # a later success clears the failure


def test_two_runs_give_identical_bytes(tiny_bert, tiny_finetunes, tmp_path):
    script = (
        "import sys, modelvec; r = modelvec.embed(sys.argv[1], sys.argv[3:], rank=4, store=sys.argv[2]);"
        "sys.stdout.buffer.write(r.vectors.tobytes())"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tiny_bert), str(tmp_path / f"{i}.duckdb"), *map(str, tiny_finetunes)],
            check=True,
            capture_output=True,
        ).stdout
        for i in range(2)
    ]
    assert len(outs[0]) == 3 * DeltaEmbedder(rank=4).fit(tiny_bert).dim_ * 4
    assert outs[0] == outs[1]


def test_sign_canonicalisation_makes_the_solver_sign_irrelevant():
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(20, 5, generator=g))
    flipped = u * torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0])
    assert torch.equal(canonical_signs(u), canonical_signs(flipped))
    c = canonical_signs(u)
    top = c.abs().argmax(dim=0)
    assert (c[top, torch.arange(5)] > 0).all()


@pytest.mark.parametrize("shape", [(160, 120), (120, 300)])
def test_randomized_solver_matches_exact_on_a_flat_decaying_spectrum(shape):
    """Fine-tuning deltas have flat spectra (sigma_i+1 / sigma_i ~ 0.9): block Krylov still gets them."""
    g = torch.Generator().manual_seed(1)
    n, m = shape
    width = min(n, m)
    a, _ = torch.linalg.qr(torch.randn(n, width, generator=g))
    b, _ = torch.linalg.qr(torch.randn(m, width, generator=g))
    steps = torch.arange(width, dtype=torch.float32)
    delta = torch.stack([(a * 0.9**steps) @ b.T, 0.1 * (a * 0.95**steps) @ b.T])
    u_e, s_e = truncated_svd(delta, 8, "exact")
    u_r, s_r = truncated_svd(delta, 8, "randomized", n_iter=3, n_oversamples=8)
    assert width > 16 * 4  # the Krylov path, not the small-matrix exact fallback
    torch.testing.assert_close(s_r, s_e, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(canonical_signs(u_r), canonical_signs(u_e), rtol=1e-3, atol=2e-4)


def test_planted_rank_two_delta_is_recovered(tiny_bert, tmp_path):
    ft = planted_finetune(tiny_bert, tmp_path / "ft", seed=3, rank=2)
    emb = DeltaEmbedder(rank=8, factor="US", pooling="concat", solver="exact", head="none").fit(tiny_bert)
    vec = emb.embed_one(ft)
    for block in emb.blocks_:
        cols = vec[block.start : block.stop].reshape(8, block.n)  # column by column
        norms = np.linalg.norm(cols, axis=1)
        assert (norms[:2] > 1e-3).all() and (norms[2:] == 0).all(), block


def test_zero_delta_gives_a_zero_vector(tiny_bert):
    vec = DeltaEmbedder(rank=4).fit(tiny_bert).embed_one(tiny_bert)
    assert not vec.any()


def test_representation_parameters_are_validated():
    with pytest.raises(ValueError, match="factor must be one of U, US"):
        Representation(factor="V")
    with pytest.raises(ValueError, match="rank must be an integer >= 1"):
        Representation(rank=0)
    assert Representation().key() != Representation(pooling="concat").key()


def test_store_load_and_parquet_export(tiny_bert, tiny_finetunes, tmp_path):
    store = tmp_path / "s.duckdb"
    result = modelvec.embed(tiny_bert, tiny_finetunes, rank=4, store=store)
    out = tmp_path / "v.parquet"
    with Store(store) as db:
        assert export_parquet(db, out) == 3
        X, meta = db.reads.load(representation=Representation(rank=4))
    table = pq.read_table(out)
    for column in ("model", "base", "rank", "factor", "pooling", "solver", "sign", "datasets", "vector"):
        assert column in table.column_names
    assert str(table.schema.field("vector").type) == "list<element: float>"
    exported = np.array(table.column("vector").to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(exported, result.vectors)
    np.testing.assert_array_equal(X, result.vectors)


def test_cli_embed_show_export(tiny_bert, tiny_finetunes, tmp_path):
    runner = CliRunner()
    store = tmp_path / "cli.duckdb"
    broken = tmp_path / "broken"
    broken.mkdir()
    args = [
        "embed",
        "--base",
        str(tiny_bert),
        *map(str, tiny_finetunes),
        str(broken),
        "--rank",
        "4",
        "--store",
        str(store),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 1, first.output  # some models failed: scripts can tell
    assert "embedded 3, skipped 0 (already stored), failed 1" in first.output
    assert "no weights found" in first.output
    assert first.output.strip().splitlines()[-1] == "some models failed: 1 of 4 (1 new)"
    again = runner.invoke(app, args)
    assert again.exit_code == 1 and "embedded 0, skipped 3 (already stored), failed 1" in again.output
    assert again.output.strip().splitlines()[-1] == "some models failed: 1 of 4 (1 new)"  # no weights: tried again
    nan = tmp_path / "nan"  # readable weights that fail: recorded, and not tried again while unchanged
    state = load_file(str(tiny_finetunes[0] / "model.safetensors"))
    state["encoder.layer.0.attention.self.query.weight"][:, 0] = float("nan")  # in every row: in those read
    save_state(nan, state, json.loads((tiny_finetunes[0] / "config.json").read_text()))
    nan_args = ["embed", "--base", str(tiny_bert), str(nan), "--rank", "4", "--store", str(store)]
    assert runner.invoke(app, nan_args).output.strip().splitlines()[-1] == "some models failed: 1 of 1 (1 new)"
    recorded = runner.invoke(app, nan_args)
    assert recorded.exit_code == 1
    last = recorded.output.strip().splitlines()[-1]
    assert last == "some models failed: 1 of 1 (0 new, 1 recorded by an earlier run (--force tries again))"
    fixed = runner.invoke(
        app, ["embed", "--base", str(tiny_bert), *map(str, tiny_finetunes), "--rank", "4", "--store", str(store)]
    )
    assert fixed.exit_code == 0, fixed.output  # all done
    shown = runner.invoke(app, ["show", "--store", str(store)])
    assert shown.exit_code == 0 and "r4-sketch" in shown.output and "failures" in shown.output
    exported = runner.invoke(app, ["export", "--parquet", str(tmp_path / "x.parquet"), "--store", str(store)])
    assert exported.exit_code == 0 and pq.read_table(tmp_path / "x.parquet").num_rows == 3
    bad = runner.invoke(
        app, ["embed", "--base", str(tiny_bert), str(tiny_finetunes[0]), "--factor", "W", "--store", str(store)]
    )
    assert bad.exit_code != 0


def test_cli_show_keeps_every_name_whole_and_lists_each_model_once(tiny_bert, tiny_finetunes, tmp_path, monkeypatch):
    from modelvec.cli import printing as cli

    store = tmp_path / "s.duckdb"
    for pooling in ("mean", "concat"):  # two vectors per model
        modelvec.embed(tiny_bert, tiny_finetunes, rank=4, pooling=pooling, probe="none", store=store)
    monkeypatch.chdir(tiny_finetunes[0].parent)  # the models show as ft0, ft1, ft2
    monkeypatch.setattr(cli.console, "width", 60)  # narrower than the representation keys and the base's path
    shown = CliRunner().invoke(app, ["show", "--store", str(store)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert all(len(line) <= 60 for line in lines)
    # too wide for 60 columns with its names whole: one record per row, every name on a line of its own, never cut
    assert lines.count(str(tiny_bert)) == 2  # the base, once per representation
    for key in (Representation(rank=4, pooling=p, probe="none").key() for p in ("mean", "concat")):
        assert any(line.split()[-1:] == [key] or f" {key} " in f" {line} " for line in lines), key
    rows = [line.split("│")[1:4] for line in lines if line.startswith("│")]  # the models' table fits: a table
    assert [[c.strip() for c in row] for row in rows] == [
        [f"ft{i}", "glue/sst2" if i % 2 else "imdb", "2"] for i in range(3)
    ]


def test_store_from_environment(tiny_bert, tiny_finetunes, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELVEC_STORE", str(tmp_path / "env.duckdb"))
    modelvec.embed(tiny_bert, tiny_finetunes[:1], rank=4)
    assert (tmp_path / "env.duckdb").exists()


def test_real_packaged_minilm(minilm, tmp_path):
    """The real all-MiniLM-L6-v2 against a fine-tune with a planted rank-2 delta in every matrix."""
    ft = planted_finetune(minilm, tmp_path / "minilm-ft", seed=0, scale=0.02, prefix="bert.")
    emb = DeltaEmbedder(rank=8, factor="U", block_norm=False, head="none").fit(minilm)
    assert emb.layout_.arch.name == "bert" and len(emb.layout_.refs) == 6 * 6
    assert emb.dim_ == 8 * (5 * 384 + 1536)
    vec = emb.embed_one(ft)
    assert vec.shape == (emb.dim_,) and np.isfinite(vec).all()
    for block in emb.blocks_:
        cols = vec[block.start : block.stop].reshape(8, block.n)
        # rank-2 planted: two live directions (mean over 6 layers of unit vectors), the rest exactly zero
        assert (np.linalg.norm(cols[:2], axis=1) > 0.1).all() and not cols[2:].any()
