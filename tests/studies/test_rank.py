"""The rank study: known spectra give known ranks, GPT-2 fused and split against transformers, outputs and CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import modelvec
from builders import save_state
from modelvec.cli import app
from modelvec.spectra import aggregate_energy_ranks as aggregate
from modelvec.spectra import energy_rank, rank_of_energies
from modelvec.spectra import energy_rank_table as rank_table
from modelvec.studies.depth import over_finetunes
from modelvec.studies.depth import spectra_of as spectra

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.mark.parametrize(
    "values, threshold, expected",
    [
        ([3, 2, 1], 0.5, 1),  # 9/14 = 0.64
        ([3, 2, 1], 0.9, 2),  # 13/14 = 0.93
        ([3, 2, 1], 0.99, 3),
        ([3, 2, 1], 1.0, 3),
        ([1, 1, 1, 1], 0.5, 2),  # ties: exactly half the energy at r = 2
        ([1, 1, 1, 1], 0.75, 3),
        ([1, 1, 1, 1], 1.0, 4),
        ([5, 4, 0, 0], 1.0, 2),  # zero singular values never count
        ([0, 0, 0], 0.9, 0),  # a zero matrix has rank 0 (documented rule)
        ([2], 0.01, 1),
    ],
)
def test_energy_rank_on_known_spectra(values, threshold, expected):
    assert energy_rank(np.array(values, dtype=np.float32), threshold) == expected


def test_energy_rank_rejects_bad_thresholds():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="threshold must be in"):
            energy_rank(np.ones(3), bad)


def _with_spectrum(base: Path, out: Path, key: str, singular_values: list[float], seed: int = 0) -> Path:
    """A copy of ``base`` whose tensor ``key`` is replaced by a matrix with the given singular values."""
    state = load_file(str(base / "model.safetensors"))
    n_out, n_in = state[key].shape
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n_out, n_out, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n_in, n_in, generator=g, dtype=torch.float64))
    s = torch.zeros(min(n_out, n_in), dtype=torch.float64)
    s[: len(singular_values)] = torch.tensor(singular_values, dtype=torch.float64)
    state[key] = (u[:, : len(s)] * s @ v[:, : len(s)].T).float()
    return save_state(out, state, json.loads((base / "config.json").read_text()))


def test_matrices_built_with_known_spectra_give_the_known_ranks(tiny_bert, tmp_path):
    key = "encoder.layer.1.attention.self.value.weight"
    model = _with_spectrum(tiny_bert, tmp_path / "m", key, [8, 4, 2, 1])
    found = {(s.layer, s.family): s for s in spectra(model)}
    sv = found[(1, "v")].singular_values
    np.testing.assert_allclose(sv[:4], [8, 4, 2, 1], rtol=1e-5)
    assert sv.dtype == np.float64 and np.abs(sv[4:]).max() < 1e-5  # the float32 file's own rounding
    table = rank_table([found[(1, "v")]], (0.5, 0.9, 0.99, 1.0)).set_index("threshold")
    # energies 64, 16, 4, 1 of 85: 0.75, 0.94, 0.988, 1.0
    assert table["rank"].to_dict() == {0.5: 1, 0.9: 2, 0.99: 4, 1.0: 4}
    assert table.loc[0.9, "rank_fraction"] == 2 / 32 and table.loc[0.9, "shape"] == "32x32"


def test_delta_spectra_are_those_of_the_difference(tiny_bert, tiny_finetunes):
    found = spectra(tiny_finetunes[0], base=tiny_bert, of="delta")
    base, ft = load_file(str(tiny_bert / "model.safetensors")), load_file(str(tiny_finetunes[0] / "model.safetensors"))
    for sp in found:
        name = {
            "q": "attention.self.query",
            "k": "attention.self.key",
            "v": "attention.self.value",
            "o": "attention.output.dense",
            "ff1": "intermediate.dense",
            "ff2": "output.dense",
        }[sp.family]
        key = f"encoder.layer.{sp.layer}.{name}.weight"
        delta = (ft[key].double() - base[key].double()).T  # x @ W orientation: [in, out]
        assert sp.shape == tuple(delta.shape)
        np.testing.assert_allclose(sp.singular_values, torch.linalg.svdvals(delta).numpy(), rtol=1e-4, atol=1e-6)
    ranks = rank_table(found, (0.999,))
    assert (ranks["rank"] == 2).all()  # the fixtures plant rank-2 deltas


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=32))
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return model, folder


def test_gpt2_fused_and_split_agree_with_transformers_modules(tiny_gpt2):
    model, folder = tiny_gpt2
    found = {(s.layer, s.family): s for s in spectra(folder)}
    d = model.config.n_embd
    for layer, block in enumerate(model.transformer.h):
        w = block.attn.c_attn.weight.detach().double()  # Conv1D: [in, 3 * out], x @ W
        assert w.shape == (d, 3 * d)
        np.testing.assert_allclose(found[(layer, "qkv")].singular_values, torch.linalg.svdvals(w).numpy(), rtol=1e-4)
        for i, family in enumerate(("q", "k", "v")):
            part = w[:, i * d : (i + 1) * d]
            x = torch.randn(5, d, dtype=torch.float64)
            q_module = block.attn.c_attn(x.float()).double()[:, i * d : (i + 1) * d]
            torch.testing.assert_close(
                x @ part + block.attn.c_attn.bias.detach().double()[i * d : (i + 1) * d], q_module, rtol=1e-4, atol=1e-5
            )
            np.testing.assert_allclose(
                found[(layer, family)].singular_values, torch.linalg.svdvals(part).numpy(), rtol=1e-4
            )
        assert found[(layer, "qkv")].shape == (d, 3 * d) and found[(layer, "q")].shape == (d, d)
        # the fused matrix holds all the energy of its parts
        fused = (found[(layer, "qkv")].singular_values.astype(float) ** 2).sum()
        parts = sum((found[(layer, f)].singular_values.astype(float) ** 2).sum() for f in "qkv")
        assert fused == pytest.approx(parts, rel=1e-5)


def test_aggregate_is_mean_and_spread_over_models(tiny_bert, tiny_finetunes):
    tables = [rank_table(spectra(ft, base=tiny_bert, of="delta"), (0.5, 0.9)) for ft in tiny_finetunes]
    agg = aggregate(tables).set_index(["stack", "family", "layer", "threshold"])
    stacked = pd.concat(tables).groupby(["stack", "family", "layer", "threshold"])["rank"]
    np.testing.assert_allclose(agg["rank"].sort_index(), stacked.mean().sort_index())
    assert (agg["models"] == 3).all()


def test_rank_study_writes_figures_csv_json_and_fits(tiny_gpt2, tmp_path):
    _, folder = tiny_gpt2
    study = modelvec.depth_report(folder, thresholds=(0.5, 0.9), out=tmp_path)
    for name in ("ranks.csv", "ranks.json", "rank-0.5.png", "rank-0.9.png"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "rank-0.9.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "ranks.json").read_text())
    assert len(data["records"]) == len(study.table) and data["singular_values"]
    assert pd.read_csv(tmp_path / "ranks.csv").shape[0] == len(study.table)
    fits = study.fits[("decoder", "qkv", 0.9)]
    assert fits and fits[0].name in ("linear", "quadratic", "exponential", "power", "quarter_ellipse")


def test_over_finetunes_records_failures_and_goes_on(tiny_bert, tiny_finetunes, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    study, failed = over_finetunes(tiny_bert, [*tiny_finetunes, broken], thresholds=(0.9,))
    assert list(failed) == [str(broken)] and "no weights found" in failed[str(broken)]
    assert (study.table["models"] == 3).all()


@pytest.mark.parametrize(
    "given",
    [
        ["--threshold", "0.5,0.9"],
        ["--threshold", "0.5", "--threshold", "0.9"],
        ["--threshold", "0.5, 0.9", "--threshold", "0.9"],
    ],
)
def test_threshold_option_takes_repeated_and_comma_separated_values(tiny_bert, tmp_path, given):
    result = CliRunner().invoke(app, ["rank", str(tiny_bert), *given, "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    assert sorted({r["threshold"] for r in json.loads(result.stdout)}) == [0.5, 0.9]
    bad = CliRunner().invoke(app, ["rank", str(tiny_bert), "--threshold", "0.5,half"])
    assert bad.exit_code == 2 and "thresholds must be a number in (0, 1], not 'half'" in " ".join(bad.output.split())


def test_rank_cli_json_and_over_finetunes(tiny_bert, tiny_finetunes, tmp_path, monkeypatch):
    from modelvec.cli import printing as cli

    monkeypatch.setattr(cli.console, "width", 72)  # narrower than the laws' equations
    runner = CliRunner()
    args = [
        "rank",
        str(tiny_finetunes[0]),
        "--base",
        str(tiny_bert),
        "--of",
        "delta",
        "--threshold",
        "0.5,0.9",
        "--out",
        str(tmp_path / "r"),
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert {"stack", "layer", "family", "shape", "threshold", "rank", "rank_fraction"} <= set(records[0])
    assert {r["threshold"] for r in records} == {0.5, 0.9}
    store = tmp_path / "s.duckdb"
    modelvec.embed(tiny_bert, tiny_finetunes, store=store)
    over = runner.invoke(
        app,
        [
            "rank",
            "--over-finetunes",
            str(tiny_bert),
            "--store",
            str(store),
            "--out",
            str(tmp_path / "o"),
            "--threshold",
            "0.9",
        ],
    )
    assert over.exit_code == 0, over.output
    assert "mean rank at layers" in over.output and (tmp_path / "o" / "rank-0.9.png").exists()
    assert "too few layers for a law (2)" in over.output and "nan" not in over.output  # 2 layers: no law
    assert "…" not in over.output.replace("layers 1, 2, …", "")  # nothing cut
    missing = runner.invoke(app, ["rank"])
    assert missing.exit_code == 2 and "give a MODEL" in missing.output


def _near_tie_matrices(seed: int, count: int = 48) -> tuple[list[np.ndarray], list[float]]:
    """float64 matrices built with spectra whose cumulative energy passes a threshold within 1e-7 of it,
    on one side or the other: the ranks a float32 SVD gets wrong."""
    rng = np.random.default_rng(seed)
    mats, thresholds = [], []
    for i in range(count):
        n, m = [(48, 32), (32, 48), (40, 40)][i % 3]
        k = min(n, m)
        energies = np.sort(rng.uniform(0.5, 2.0, k))[::-1]
        energies /= energies.sum()
        r = int(rng.integers(2, k - 2))
        t = float(np.cumsum(energies)[r - 1]) + (1 if i % 2 else -1) * float(rng.uniform(2e-9, 1e-7)) * (
            0.1 if i % 4 < 2 else 1.0
        )
        u, _ = np.linalg.qr(rng.standard_normal((n, k)))
        v, _ = np.linalg.qr(rng.standard_normal((m, k)))
        mats.append((u * np.sqrt(energies)) @ v.T)
        thresholds.append(t)
    return mats, thresholds


def test_ranks_equal_a_float64_svd_exactly_at_near_tied_thresholds():
    from modelvec.spectra.energy import gram_energies, rank_of_energies

    mats, thresholds = _near_tie_matrices(0)
    by_shape: dict = {}
    for i, w in enumerate(mats):
        by_shape.setdefault(w.shape, []).append(i)
    float32_misses = 0
    for idx in by_shape.values():
        energies = gram_energies([torch.from_numpy(mats[i]) for i in idx])
        for i, e in zip(idx, energies):
            reference = np.linalg.svd(mats[i], compute_uv=False) ** 2  # float64 LAPACK
            t = thresholds[i]
            assert rank_of_energies(e, t) == rank_of_energies(reference, t), (i, t)
            s32 = torch.linalg.svdvals(torch.from_numpy(mats[i]).float()).double().numpy() ** 2
            float32_misses += rank_of_energies(s32, t) != rank_of_energies(reference, t)
    assert float32_misses > 0  # the construction is sharp enough to move float32 ranks


def test_rank_study_of_a_bf16_checkpoint_is_that_of_its_float32_upcast(tiny_bert, tmp_path):
    state = load_file(str(tiny_bert / "model.safetensors"))
    bf16 = save_state(
        tmp_path / "bf16",
        {k: v.bfloat16() for k, v in state.items()},
        json.loads((tiny_bert / "config.json").read_text()),
    )
    upcast = save_state(
        tmp_path / "f32",
        {k: v.bfloat16().float() for k, v in state.items()},
        json.loads((tiny_bert / "config.json").read_text()),
    )
    a, b = spectra(bf16), spectra(upcast)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.energies, y.energies)


def test_rank_figure_bands_stay_within_possible_ranks_and_the_title_inside(tmp_path):
    """Three models whose ranks 1, 1, 20 give mean − std below 0: the band is the quartiles instead,
    and the (long) title is drawn inside the figure."""
    from matplotlib.figure import Figure

    from modelvec.plots import depth as plots_rank

    tables = [
        pd.DataFrame(
            [
                {
                    "stack": "decoder",
                    "family": "q",
                    "layer": layer,
                    "shape": "32x32",
                    "threshold": 0.9,
                    "rank": r,
                    "rank_fraction": r / 32,
                }
                for layer in range(4)
            ]
        )
        for r in (1, 1, 20)
    ]
    agg = aggregate(tables)
    assert (agg["rank"] - agg["rank_std"] < 0).all()  # what the old band drew
    drawn = {}
    save = Figure.savefig

    def keep(fig, *args, **kwargs):
        fig.canvas.draw()
        drawn["fig"] = fig
        return save(fig, *args, **kwargs)

    import unittest.mock

    title = "20 fine-tunes of a-very-long-organisation-name/a-very-long-model-name-for-testing: mean rank of ΔW"
    with unittest.mock.patch.object(Figure, "savefig", keep):
        plots_rank.plot_rank(agg, {}, 0.9, tmp_path / "r.png", title=title)
    fig = drawn["fig"]
    band = [c for ax in fig.axes for c in ax.collections]
    assert band and min(p[:, 1].min() for c in band for p in (c.get_paths()[0].vertices,)) >= 1
    renderer = fig.canvas.get_renderer()
    box = fig._suptitle.get_window_extent(renderer)
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
    assert "band: middle half" in " ".join(fig._suptitle.get_text().split())  # the title wraps
    with unittest.mock.patch.object(Figure, "savefig", keep):  # one model: no band, and no word of one
        plots_rank.plot_rank(tables[0], {}, 0.9, tmp_path / "one.png", title="one model")
    assert not [c for ax in drawn["fig"].axes for c in ax.collections]
    assert "band" not in drawn["fig"]._suptitle.get_text()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_float64_upcast_is_exact_for_every_stored_dtype_and_view(dtype):
    from modelvec.spectra.energy import as_float64

    w = (torch.randn(9, 6, generator=torch.Generator().manual_seed(0)) * 1e3).to(dtype)
    w[0, 0], w[1, 1], w[2, 2], w[3, 3] = float("inf"), float("nan"), -0.0, torch.finfo(dtype).tiny
    for view in (w, w.T, w[::2, 1:]):  # contiguous, transposed, strided (a fused tensor's part)
        a = as_float64(view)
        expected = view.double().numpy()
        assert a.dtype == np.float64 and a.flags["C_CONTIGUOUS"] and a.shape == expected.shape
        np.testing.assert_array_equal(a, expected)  # NaN where NaN, bit-equal elsewhere
        assert np.array_equal(np.signbit(a), np.signbit(expected))


def test_a_fused_matrix_from_its_parts_grams_has_the_float64_ranks_at_near_tied_thresholds():
    """W = [W_1 W_2 W_3] with a spectrum built to pass a threshold within 1e-7 of it: the whole's
    energies come from the sum of the parts' Grams, and every rank (whole and parts) is the float64 SVD's."""
    from modelvec.spectra.energy import fused_gram_energies, fuses_by_gram, rank_of_energies

    rng = np.random.default_rng(1)
    groups, thresholds = [], []
    for i in range(24):
        n, m = 24, 72
        energies = np.sort(rng.uniform(0.5, 2.0, n))[::-1]
        energies /= energies.sum()
        r = int(rng.integers(2, n - 2))
        thresholds.append(float(np.cumsum(energies)[r - 1]) + (1 if i % 2 else -1) * float(rng.uniform(2e-9, 1e-7)))
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((m, n)))
        w = (u * np.sqrt(energies)) @ v.T
        groups.append([torch.from_numpy(w[:, j : j + 24]) for j in (0, 24, 48)])
    assert fuses_by_gram([(24, 24)] * 3) and not fuses_by_gram([(24, 24), (24, 8)])  # a narrow part (GQA's k)
    float32_misses = 0
    for parts, values, t in zip(groups, fused_gram_energies(groups), thresholds):
        whole = torch.cat(parts, 1).numpy()
        assert len(values) == 4
        for e, w in zip(values, [p.numpy() for p in parts] + [whole]):
            reference = np.linalg.svd(w, compute_uv=False) ** 2
            np.testing.assert_allclose(e, reference, rtol=1e-9, atol=1e-15)
            assert rank_of_energies(e, t) == rank_of_energies(reference, t)
        s32 = torch.linalg.svdvals(torch.from_numpy(whole).float()).double().numpy() ** 2
        float32_misses += rank_of_energies(s32, t) != rank_of_energies(values[-1], t)
    assert float32_misses > 0  # sharp enough to move float32 ranks of the whole


def test_a_fused_delta_has_the_spectra_of_the_difference_whole_and_in_parts(tiny_gpt2, tmp_path):
    model, folder = tiny_gpt2
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    ft_state = {
        k: v + 1e-2 * torch.randn(v.shape, generator=g) if "c_attn.weight" in k else v for k, v in state.items()
    }
    ft = save_state(tmp_path / "ft", ft_state, json.loads((folder / "config.json").read_text()))
    found = {(s.layer, s.family): s for s in spectra(ft, base=folder, of="delta")}
    d = model.config.n_embd
    for layer in range(model.config.n_layer):
        key = f"h.{layer}.attn.c_attn.weight"
        key = next(k for k in state if k.endswith(key))
        delta = ft_state[key].double().numpy() - state[key].double().numpy()  # Conv1D: [in, 3 * out]
        for family, w in [("qkv", delta)] + [(f, delta[:, i * d : (i + 1) * d]) for i, f in enumerate("qkv")]:
            reference = np.linalg.svd(w, compute_uv=False) ** 2  # float64, relative to the largest
            np.testing.assert_allclose(found[(layer, family)].energies, reference, rtol=1e-9, atol=1e-12 * reference[0])
        assert found[(layer, "qkv")].shape == (d, 3 * d) and found[(layer, "k")].shape == (d, d)


def test_a_nan_in_a_fused_tensor_is_a_checkpoint_error_naming_it(tiny_gpt2, tmp_path):
    from modelvec.core.errors import CheckpointError

    _, folder = tiny_gpt2
    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in state if k.endswith("h.1.attn.c_attn.weight"))
    state[key] = state[key].clone()
    state[key][3, 70] = float("nan")  # in the v part
    bad = save_state(tmp_path / "bad", state, json.loads((folder / "config.json").read_text()))
    with pytest.raises(CheckpointError, match=r"h\.1\.attn\.c_attn\.weight has NaN or Inf values"):
        spectra(bad)


# --- what `modelvec rank` prints: the ranks, laws only where they fit, equations whole ----------------------------

NUMBER = r"−?-?\d+(?:\.\d+)?"


def _table_rows(output: str, first: str) -> dict[str, list[str]]:
    """The cells of a rich table printed in ``output`` whose first column is headed ``first``: the first cell of each
    row -> its cells, a cell's wrapped lines joined by a space (rows start where the first cell is non-empty)."""
    rows: dict[str, list[str]] = {}
    inside, current = False, None
    for line in output.splitlines():
        if line.startswith("┃") and line.split("┃")[1].strip() == first:
            inside, current = True, None
            continue
        if not inside or not line.startswith("│"):
            if line.startswith("└"):
                inside = False
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[0]:
            current = cells[0]
            rows[current] = cells
        elif current is not None:
            rows[current] = [f"{a} {b}".strip() for a, b in zip(rows[current], cells)]
    return rows


def test_rank_cli_on_two_layers_prints_the_ranks_and_too_few_layers(tiny_bert, tmp_path, monkeypatch):
    from modelvec.cli import printing as cli

    monkeypatch.setattr(cli.console, "width", 80)
    result = CliRunner().invoke(app, ["rank", str(tiny_bert), "--threshold", "0.9", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    table = modelvec.depth_report(tiny_bert, thresholds=(0.9,)).table
    rows = _table_rows(result.output, "family")
    assert set(rows) == set(table["family"])
    for family, group in table.groupby("family"):
        ranks = [str(int(r)) for r in group.sort_values("layer")["rank"]]
        assert rows[family][1].split() == ranks, family  # the ranks at layers 1, 2, in order
        assert rows[family][2] == "too few layers for a law (2)"
    assert "nan" not in result.output.lower() and "r(x)" not in result.output  # no law, no equation
    assert "e-1" not in result.output and "e−1" not in result.output


@pytest.fixture(scope="module")
def planted_depth(tmp_path_factory):
    """An 8-layer tiny BERT whose query matrices have 2, 3, …, 9 equal singular values (ranks on a line) and whose
    key matrices zig-zag (ranks 8, 1, 8, 1, …: no law can follow them)."""
    from transformers import BertModel

    from builders import tiny_bert_config

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("deep")
    config = tiny_bert_config(num_hidden_layers=8)
    BertModel(config).save_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for layer in range(8):
        for name, k in (("query", layer + 2), ("key", 8 if layer % 2 == 0 else 1)):
            key = f"encoder.layer.{layer}.attention.self.{name}.weight"
            u, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
            v, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
            state[key] = (u[:, :k] @ v[:, :k].T).float()  # k singular values of 1: rank k at threshold 0.99
    return save_state(tmp_path_factory.mktemp("planted"), state, config.to_dict())


def test_rank_cli_shows_laws_only_where_they_fit_and_prints_equations_whole(planted_depth, tmp_path, monkeypatch):
    from modelvec.analyse.laws import MIN_ADJ_R2, shown_law
    from modelvec.cli import printing as cli
    from modelvec.plots.depth import rank_figure

    study = modelvec.depth_report(planted_depth, thresholds=(0.99,))
    q_fits, k_fits = study.fits[("encoder", "q", 0.99)], study.fits[("encoder", "k", 0.99)]
    best_k = max(f.adj_r2 for f in k_fits if f.adj_r2 == f.adj_r2)
    assert best_k < MIN_ADJ_R2 and shown_law(k_fits)[0] is None  # the zig-zag: no law fits
    q_law = shown_law(q_fits)[0]
    assert q_law is not None and q_law.adj_r2 >= MIN_ADJ_R2
    shown = [(key[1], law) for key, fits in study.fits.items() for law in [shown_law(fits)[0]] if law is not None]
    for width in (80, 60):
        monkeypatch.setattr(cli.console, "width", width)
        result = CliRunner().invoke(app, ["rank", str(planted_depth), "--threshold", "0.99", "--out", str(tmp_path)])
        assert result.exit_code == 0, result.output
        rows = _table_rows(result.output, "family")
        assert rows["q"][1].split() == [str(r) for r in range(2, 10)]
        assert rows["k"][1].split() == ["8", "1"] * 4
        assert rows["k"][2] == f"no law fits (best adj. R² {best_k:.2f})"
        assert rows["q"][2] == f"{q_law.name.replace('_', ' ')}, adj. R² {q_law.adj_r2:.2f}"
        assert f"adjusted R², where that is ≥ {MIN_ADJ_R2:g}" in " ".join(result.output.split())  # the caption
        printed = [line for line in result.output.splitlines() if "r(x) =" in line]
        assert len(printed) == len(shown)
        for family, law in shown:  # each on a line of its own, whole (not a terminal: one line however long)
            verdict = f"{law.name.replace('_', ' ')}, adj. R² {law.adj_r2:.2f}"
            assert f"{family}, threshold 0.99: {law.equation}  ({verdict})" in printed
        assert "nan" not in result.output.lower() and "e-1" not in result.output and "e−1" not in result.output
    assert q_law.equation == "r(x) = 1 + 1·x"  # the ranks 2..9 exactly: no rounding noise in its terms
    fig = rank_figure(study.table, study.fits, 0.99)
    dashed = {line.get_label() for ax in fig.axes for line in ax.lines if line.get_linestyle() == "--"}
    assert "_law q" in dashed and "_law k" not in dashed
    assert dashed == {f"_law {family}" for family, _ in shown}


@pytest.mark.parametrize("width", [80, 60, 200])
def test_ranks_and_equations_wrap_at_spaces_in_a_terminal(width):
    """Many layers of four-digit ranks in a terminal of ``width`` columns: every rank in its cell whole and in order,
    and every equation's numbers whole although rich wraps its line."""
    import io

    from rich.console import Console

    from modelvec.analyse.laws import shown_law
    from modelvec.cli.rank import show_ranks
    from modelvec.spectra.tables import fit_depth_laws
    from modelvec.studies.depth import DepthStudy

    rng = np.random.default_rng(0)
    rows = [
        {"stack": stack, "layer": layer, "family": family, "shape": "4096x4096", "threshold": 0.9, "rank": r}
        for stack in ("encoder", "decoder")
        for family, noise in (("q", 5.0), ("ff_gate", 900.0))
        for layer in range(48)
        for r in [int(900 + 37 * layer + rng.normal(0, noise))]
    ]
    table = pd.DataFrame(rows)
    study = DepthStudy(model="org/a-model", of="weights", table=table, spectra=[], fits=fit_depth_laws(table))
    out = io.StringIO()
    show_ranks(study, Console(file=out, width=width, force_terminal=True, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    lines = [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    for (stack, family), group in table.groupby(["stack", "family"]):
        start = next(i for i, cells in enumerate(lines) if cells[:2] == [stack, family])
        ranks = lines[start][2].split()
        for cells in lines[start + 1 :]:
            if cells[0] or cells[1]:  # the next row
                break
            ranks += cells[2].split()
        assert len(lines[start + 1]) == 4 and not lines[start + 1][0]  # the ranks wrapped onto a second line
        assert ranks == [str(r) for r in group.sort_values("layer")["rank"]], (stack, family)
    flat = " ".join(text.split())
    for fits in study.fits.values():
        law = shown_law(fits)[0]
        if law is not None:
            assert law.equation in flat  # wrapped at spaces only: joined again, the equation is whole
            for number in re.findall(NUMBER, law.equation):
                assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d.])", text), number


@pytest.mark.parametrize("of", ["weights", "delta"])
def test_the_gpu_pipeline_run_on_the_cpu_gives_the_cpu_paths_energies(tiny_gpt2, tmp_path, of):
    """The GPU's code (bytes read ahead on threads, torch Grams and eigenvalues), run here on the CPU's torch,
    against the numpy path: the same float64 energies, so the same ranks, whole and in parts."""
    from modelvec.read import open_checkpoint
    from modelvec.studies import spectra as module

    _, folder = tiny_gpt2
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    ft = save_state(
        tmp_path / "ft",
        {k: v + 1e-2 * torch.randn(v.shape, generator=g) if v.ndim == 2 else v for k, v in state.items()},
        json.loads((folder / "config.json").read_text()),
    )
    ck, base = open_checkpoint(ft), (open_checkpoint(folder) if of == "delta" else None)
    _, tensors = module.plan_tensors(ck, ck.layout())
    assert any(t.from_parts for t in tensors)  # c_attn's whole from its parts' Grams on both paths
    numpy_path = module._on_cpu(ck, base, tensors, "cpu")
    torch_path = module._on_gpu(ck, base, tensors, "cpu")
    for a, b in zip(numpy_path, torch_path):
        for x, y in zip(a, b):
            np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-13 * x[0])
            assert [rank_of_energies(y, t) for t in (0.5, 0.9, 0.99)] == [
                rank_of_energies(x, t) for t in (0.5, 0.9, 0.99)
            ]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_torch_grams_give_float64_ranks_at_near_tied_thresholds(device):
    """The GPU's arithmetic (float64 Gram and syevd on the device) at thresholds within 1e-7 of a boundary:
    every rank is a float64 SVD's, where float32 moves some (there is no float32 path to fall back from)."""
    from modelvec.studies.spectra import _eigenvalues, _grams

    mats, thresholds = _near_tie_matrices(7)
    for w, t in zip(mats, thresholds):
        (gram,) = _grams([torch.from_numpy(w).to(device)], whole=False)
        reference = np.linalg.svd(w, compute_uv=False) ** 2
        assert rank_of_energies(_eigenvalues(gram), t) == rank_of_energies(reference, t)


RANK_IMPORTS = """
import sys
from modelvec.cli import main
sys.argv = ["modelvec", "rank", sys.argv[1], "--out", sys.argv[2]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("torch imported:", "torch" in sys.modules)
"""


def test_the_rank_study_of_safetensors_on_the_cpu_imports_no_torch(tiny_bert, tmp_path):
    """The torch import is about a second of a bert-base study (docs/scale.md); numpy reads safetensors."""
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if Path("/proc/driver/nvidia/gpus").exists():
        pytest.skip("a GPU here: auto is CUDA, which needs torch")
    out = subprocess.run(
        [sys.executable, "-c", RANK_IMPORTS, str(tiny_bert), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch imported: False" in out.stdout
    assert (tmp_path / "out" / "rank-0.9.png").exists()
