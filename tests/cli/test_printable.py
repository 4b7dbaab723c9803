"""Names from the outside world (folders, cards' datasets and authors, errors) reach people escaped: a newline or a
terminal escape sequence in a folder's name neither breaks a line nor drives the terminal, console markup and emoji
codes in it are printed as written; ``--json`` keeps the exact names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders import planted_finetune
from modelvec.cli import app
from modelvec.cli.printing import printable

#: A folder's name with a newline, a colour escape, rich's markup and an emoji code.
EVIL = "evil [/x] :fire:\n\x1b[31mred"
#: As every printer shows it (Python's escapes).
EVIL_SHOWN = "evil [/x] :fire:\\n\\x1b[31mred"
#: A dataset and an author whose card declares them with escape sequences (YAML's "\e").
CARD = '---\ndatasets:\n- "imdb\\e[2J"\nauthor: "\\e[5mblink"\n---\n# a fine-tune\n'


@pytest.fixture(scope="module")
def hostile(tiny_bert, tmp_path_factory):
    """A store holding a fine-tune in a folder named :data:`EVIL` beside two plain ones, and a folder of that kind
    without weights (a failure): embedded by the CLI, whose output is kept."""
    root = tmp_path_factory.mktemp("printable")
    evil = planted_finetune(tiny_bert, root / EVIL, seed=70)
    (evil / "README.md").write_text(CARD)
    plain = [planted_finetune(tiny_bert, root / f"ft{i}", seed=71 + i) for i in range(2)]
    plain[0].joinpath("README.md").write_text(CARD)
    plain[1].joinpath("README.md").write_text(CARD.replace("imdb", "sst2"))
    broken = root / "broken\n\x1b[1mbold"
    broken.mkdir()
    store = root / "store.duckdb"
    args = ["embed", "--base", str(tiny_bert), str(evil), *map(str, plain), str(broken), "--store", str(store)]
    embedded = CliRunner().invoke(app, args)
    return tiny_bert, evil, store, root, embedded


def assert_escaped(output: str, *shown: str) -> None:
    """No escape character nor a raw name reached the output; the names in ``shown`` are there, escaped."""
    assert "\x1b" not in output, output[-2000:]
    assert EVIL not in output and "broken\n" not in output and "🔥" not in output
    for text in shown:
        assert text in output, (text, output[-2000:])


def test_every_printer_escapes_names_from_the_outside_world(hostile, tmp_path, recwarn):
    base, evil, store, _, embedded = hostile
    assert embedded.exit_code == 1, embedded.output  # the folder without weights failed; the others were stored
    assert_escaped(embedded.output, "failed: '", "broken\\n\\x1b[1mbold", "embedded 3, skipped 0")
    runs = {
        "show": (["show"], [EVIL_SHOWN, "'imdb\\x1b[2j'", "broken\\n\\x1b[1mbold"]),
        "cluster": (["cluster", str(base), "--reduce", "pca", "--out", str(tmp_path / "map")], ["'imdb\\x1b[2j'"]),
        "neighbors": (["neighbors", str(evil), "--k", "2"], [EVIL_SHOWN, "'imdb\\x1b[2j'", "'\\x1b[5mblink'"]),
        "tree": (["tree", str(base), "--out", str(tmp_path / "tree")], [EVIL_SHOWN]),
    }
    for name, (args, shown) in runs.items():
        result = CliRunner().invoke(app, [*args, "--store", str(store)])
        assert result.exit_code == 0, (name, result.output[-2000:])
        assert_escaped(result.output, *shown)
    ranked = CliRunner().invoke(app, ["rank", str(evil), "--base", str(base), "--of", "delta", "--out", str(tmp_path)])
    assert ranked.exit_code == 0, ranked.output[-2000:]
    assert_escaped(ranked.output, EVIL_SHOWN)
    drawn = [str(w.message) for w in recwarn]  # the figures' own text: a glyph matplotlib lacks would be warned raw
    assert not [m for m in drawn if "\x1b" in m or "Glyph" in m], drawn


def test_json_keeps_the_exact_names(hostile):
    _, evil, store, _, _ = hostile
    shown = json.loads(CliRunner().invoke(app, ["show", "--store", str(store), "--json"]).stdout)
    stored = {m["model"]: m["datasets"] for m in shown["models"]}
    assert stored[str(evil.resolve())] == ["imdb\x1b[2j"]
    failures = [f["model"] for f in shown["failures"]]
    assert any(f.endswith("broken\n\x1b[1mbold") for f in failures)


def test_an_error_naming_a_hostile_path_is_one_escaped_line(hostile, tmp_path):
    base, _, store, _, _ = hostile
    blocked = tmp_path / "file\x1b[31m"
    blocked.write_text("not a folder")
    out = blocked / "map"
    result = CliRunner().invoke(
        app, ["cluster", str(base), "--store", str(store), "--reduce", "pca", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output[-2000:]
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error: ") and "file\\x1b[31m" in lines[-1] and "\x1b" not in result.output


def test_printable_leaves_plain_text_as_it_is():
    assert printable("alice/bert-imdb (glue/sst2, 3 models)") == "alice/bert-imdb (glue/sst2, 3 models)"
    assert printable("café [x]") == "café [x]"
    assert printable("a\nb") == "'a\\nb'" and printable(Path("x\x1b")) == "'x\\x1b'"
    assert printable(printable("a\nb")) == printable("a\nb")  # escaped once, however often it is shown
