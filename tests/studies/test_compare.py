"""Which representation: the sweep's values (one default per setting, the same in the API and ``evaluate``), the
variants they make, and the command's options made from the representation's declarations."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

import modelvec.studies
from modelvec.cli import app
from modelvec.cli import evaluate as evaluate_command
from modelvec.represent.representation import Representation
from modelvec.studies.grid import SVD_GRID, VARIANTS, variants
from modelvec.studies.sweep import SWEPT, Sweep


def test_a_sweep_holds_each_fields_default_unless_given_and_checks_every_value():
    default = Sweep()
    assert [default[name] for name in SWEPT] == [(32,), ("auto",), (64,), ("countsketch",), ("auto",), (0,)]
    assert [default[name] for name in SWEPT] == [(getattr(Representation(), name),) for name in SWEPT]
    given = Sweep(rank=(8, 16), rows=("auto", 1, 0.05), projection="shared")
    assert given["rank"] == (8, 16) and given["rows"] == ("auto", 1.0, 0.05) and given["projection"] == ("shared",)
    assert given["seed"] == (0,) and Sweep(rank=range(8, 17, 8)) == Sweep(rank=(8, 16), seed=0)
    with pytest.raises(ValueError, match=r"rows must be a number in \(0, 1\] or auto, not 'half'"):
        Sweep(rows=(1, "half"))
    budgets = variants(
        Sweep(rows=("auto", 0.05), auto_rows=(16, "share"), projection="countsketch"), svd=False, default=False
    )
    reads = {(p.rows, p.auto_rows if p.rows == "auto" else None) for p in budgets.values()}
    assert reads == {("auto", 16), ("auto", "share"), (0.05, None)}  # auto with each budget, a share once
    with pytest.raises(ValueError, match="projection must be one of shared, gaussian, countsketch, not 'nope'"):
        Sweep(projection="nope")
    with pytest.raises(ValueError, match="a sweep takes rank, rows, auto_rows, projection, probe, seed, not pooling"):
        Sweep(pooling=("mean",))
    with pytest.raises(ValueError, match="at least one value"):
        Sweep(rank=())


def test_the_default_comparison_is_every_field_at_its_one_default():
    """The SVD factors with and without block normalisation, the block-normed CountSketch of auto rows (mean and
    concatenated), and the default itself: 15 parameter sets, as VARIANTS's comment says."""
    assert variants() == variants(Sweep()) == VARIANTS
    assert len(VARIANTS) == 2 * len(SVD_GRID) + 2 + 1 == 15
    sketches = [p for p in VARIANTS.values() if not p.uses_svd and p != Representation()]
    assert sketches == [Representation(pooling=pooling, head="none") for pooling in ("mean", "concat")]
    assert [name for name, p in VARIANTS.items() if p == Representation()] == [f"{Representation().label()} (default)"]


def test_the_comparison_before_one_default_is_one_sweep_away():
    """``evaluate --projection shared --rows 1`` compares what evaluate compared by default before its sweeps took
    the representation's defaults: the shared Ω over every row, mean and concatenated, with and without block
    normalisation, beside the SVD factors (17 parameter sets, every name and key as before)."""
    before = variants(Sweep(projection="shared", rows=1))
    assert len(before) == 17
    sketches = {name: p.key() for name, p in before.items() if not p.uses_svd}
    assert sketches == {
        "sketch ΔW·Ω": "r32-sketch-mean-seed0",
        "sketch ΔW·Ω, concat": "r32-sketch-concat-seed0",
        "sketch ΔW·Ω + block-norm": "r32-sketch-mean-seed0-bn",
        "sketch ΔW·Ω, concat + block-norm": "r32-sketch-concat-seed0-bn",
        f"{Representation().label()} (default)": Representation().key(),
    }


@pytest.fixture
def called(monkeypatch):
    """What ``modelvec evaluate`` asks the API for, without embedding anything."""
    calls: list[dict] = []

    def fake(base, models, **kwargs):
        calls.append(kwargs)
        return pd.DataFrame([{"method": "m", "half": "all", "knn_spread": 0.0, "selected": True}])

    monkeypatch.setattr(modelvec.studies, "evaluate", fake)
    return calls


def test_the_command_sweeps_the_representations_fields_with_their_defaults(called):
    assert evaluate_command.SWEPT == SWEPT  # the command's options are the API's sweep
    run = lambda *args: CliRunner().invoke(app, ["evaluate", "m1", "m2", "m3", "--base", "b", *args, "--json"])
    assert run().exit_code == 0
    assert called[-1]["variants"] == VARIANTS and called[-1]["seeds"] == (0,)
    # the declaration's flags, and the plural ones scripts used before, repeated or comma-separated
    result = run("--ranks", "8,16", "--rank", "32", "--projections", "shared", "--rows", "auto,1", "--seeds", "0,1")
    assert result.exit_code == 0, result.output
    asked = Sweep(rank=(8, 16, 32), projection="shared", rows=("auto", 1))
    assert called[-1]["variants"] == variants(asked) and called[-1]["seeds"] == (0, 1)
    assert run("--projection", "gaussian", "--seed", "3", "--no-svd", "--vocabulary-head").exit_code == 0
    assert called[-1]["variants"] == variants(Sweep(projection="gaussian"), vocabulary_head=True, svd=False)
    assert called[-1]["seeds"] == (3,)
    bad = run("--projection", "shared,nope")
    said = " ".join(bad.output.replace("│", " ").split())
    assert bad.exit_code == 2 and "projection must be one of shared, gaussian, countsketch, not 'nope'" in said, said


def test_the_commands_help_is_the_declarations():
    text = " ".join(CliRunner().invoke(app, ["evaluate", "--help"]).output.split())
    for flags in (
        "--rank, --ranks N,...",
        "--rows SHARE,...",
        "--projection, --projections NAME,...",
        "--seed, --seeds",
    ):
        assert flags in text
    assert "[default: auto]" in text and "[default: countsketch]" in text and "[default: 32]" in text
    assert "Width r of each matrix's sketch" in text  # the field's own help
