"""A model card that cannot be read leaves its model unlabelled, never failed, and ``embed`` says so: one line per
model, naming the card's fault, once per run."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import modelvec
from builders import planted_finetune
from modelvec.cli import app
from modelvec.hub.cards import card_of
from modelvec.store import Store

#: A card whose YAML is malformed on line 4 of the README (a second ``:`` in a plain value).
MALFORMED = "---\ndatasets:\n- imdb\nlicense: mit: or not\n---\n# a fine-tune\n"
FAULT = "README.md's front matter is not valid YAML: mapping values are not allowed here (line 4, column 13)"


def models(base: Path, root: Path) -> tuple[Path, Path, Path]:
    """A fine-tune with a malformed card, one whose name says its dataset (the only label left), and a sound one."""
    bad = planted_finetune(base, root / "bad-card", seed=21)
    named = planted_finetune(base, root / "bert-imdb", seed=22)
    for folder in (bad, named):
        (folder / "README.md").write_text(MALFORMED)
    sound = planted_finetune(base, root / "sound", seed=23, card_datasets=["sst2"])
    return bad, named, sound


def test_a_malformed_card_is_said_once_and_the_model_is_embedded_unlabelled(tiny_bert, tmp_path):
    bad, named, sound = models(tiny_bert, tmp_path)
    store = tmp_path / "api.duckdb"
    result = modelvec.embed(tiny_bert, [bad, named, sound], store=store)
    assert sorted(result.embedded) == sorted(str(m.resolve()) for m in (bad, named, sound)) and not result.failed
    assert result.notes == {
        f"{bad.resolve()}: its model card was not read ({FAULT}): embedded without labels": [str(bad.resolve())],
        f"{named.resolve()}: its model card was not read ({FAULT}): labelled from its name alone": [
            str(named.resolve())
        ],
    }
    with Store(store) as db:
        labels = {Path(m).name: list(d) for m, d in zip(db.reads.metadata()["model"], db.reads.metadata()["datasets"])}
    assert labels == {"bad-card": [], "bert-imdb": ["imdb"], "sound": ["glue/sst2"]}
    again = modelvec.embed(tiny_bert, [bad, named, sound], store=store)  # nothing read again: nothing said again
    assert len(again.skipped) == 3 and again.notes == {}


def test_embed_says_which_cards_could_not_be_read_one_line_each(tiny_bert, tmp_path, monkeypatch):
    bad, named, sound = models(tiny_bert, tmp_path)
    monkeypatch.chdir(tmp_path)  # the models as typed: relative to here
    args = ["embed", "--base", str(tiny_bert), "bad-card", "bert-imdb", "sound", "--store", "cli.duckdb"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: bad-card: its model card was not read ({FAULT}): embedded without labels",
        f"note: bert-imdb: its model card was not read ({FAULT}): labelled from its name alone",
    ]
    assert "embedded 3, skipped 0 (already stored), failed 0" in result.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "note:" not in again.output and "skipped 3" in again.output


def test_why_a_card_could_not_be_read(tmp_path):
    def card(text: str | bytes) -> tuple[dict, str | None]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "README.md").write_bytes(text if isinstance(text, bytes) else text.encode())
        return card_of(folder)

    assert card_of(tmp_path / "no-such-folder") == ({}, None)  # no card: nothing to say
    assert card("# no front matter\n") == ({}, None)
    assert card("---\ndatasets: [imdb]\nauthor: alice\n---\n") == ({"datasets": ["imdb"], "author": "alice"}, None)
    assert card("\n\n---\nlicense: mit: x\n---\n") == ({}, FAULT)  # lines counted in the README
    assert card("---\n- imdb\n---\n") == ({}, "README.md's front matter is a YAML list, not a mapping of fields")
    assert card(b"---\ndatasets: [\xff]\n---\n") == ({}, "README.md is not UTF-8 text")
