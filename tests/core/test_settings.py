"""Every setting declared once, as data: its help, choices, bounds and place in the key come from one field, and the
CLI's options, validation and the stored key all follow from it; adding a field adds it everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from modelvec.analyse.reduction import Reduction
from modelvec.analyse.scores import Scoring
from modelvec.analyse.tree.rule import TreeRule
from modelvec.core.settings import flags, key_of, settings_of
from modelvec.hub.client import HubSettings
from modelvec.hub.discovery import Scope
from modelvec.represent.representation import Representation
from modelvec.run.engines import Execution
from modelvec.spectra.energy import Ranks

#: Every settings object: each command's options are made from one or more of these (the tree's thresholds and the
#: Hub's reach too, though no command offers them as options).
SETTINGS = [Representation, Scoring, Scope, Execution, Reduction, Ranks, TreeRule, HubSettings]


@pytest.mark.parametrize("cls", SETTINGS)
def test_every_setting_has_help_and_the_representations_a_place_in_the_key(cls):
    for field, meta in settings_of(cls):
        assert meta.help.strip(), field.name
        if cls is Representation:
            assert meta.key is not None and meta.order > 0, f"{field.name} changes the vector but not its key"
    orders = [m.order for _, m in settings_of(Representation)]
    assert len(set(orders)) == len(orders)


def test_keys_stored_before_these_settings_existed_name_the_same_vectors():
    """The key is derived from the declarations, and a key written before projection, rows, head and size existed
    is unchanged."""
    assert Representation(rank=8, projection="shared", rows=1, head="none").key() == "r8-sketch-mean-seed0-bn"
    assert Representation.from_stored(dict(rank=8)).key() == "r8-sketch-mean-seed0-bn"
    assert Representation().key() == "r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000-probe-auto"
    before_probe = Representation().as_dict()
    del before_probe["probe"]  # the default of 2026-11-27 (the delta itself, whatever the family)
    assert (
        Representation.from_stored(before_probe).key() == "r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000"
    )
    before_size = Representation(size="none").as_dict()
    del before_size["size"], before_size["auto_rows"], before_size["probe"]  # the default of 2026-11-25
    assert Representation.from_stored(before_size).key() == "r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto"
    before_count = Representation().as_dict()
    del before_count["auto_rows"], before_count["probe"]  # the default of 2026-11-26 (5 % of a large model's rows)
    assert Representation.from_stored(before_count).key() == "r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto-d100000"
    assert Representation.from_stored(before_count).row_budget(10**9) == 0.05
    assert (
        Representation(factor="U", rank=4, seed=3, head="none").key() == "r4-U-mean-randomized-max-abs-it4-os8-seed3-bn"
    )
    assert Representation(factor="S", rank=8, solver="exact", block_norm=False, head="none").key() == "r8-S-mean-exact"
    assert (
        Representation(head="vocabulary", pooling="concat", projection="shared").key().endswith("-bn-head-vocabulary")
    )
    assert (
        key_of(Representation(rank=8, projection="countsketch", rows=0.05, head="none", size="none", probe="none"))
        == "r8-sketch-mean-seed0-cs-rows0.05-bn"
    )


def test_every_default_key_the_project_has_had_still_names_its_vectors():
    """The store keys' history is data (``KEY_HISTORY``): each default representation, as the store recorded it then,
    reads back to exactly its key today; today's default is its last line. An edited declaration (a format, an
    ``omit``, an ``until_added``) that would rename stored vectors fails here."""
    from modelvec.represent.representation import KEY_HISTORY

    keys = [key for key, _ in KEY_HISTORY]
    assert keys == [
        "r8-sketch-mean-seed0-bn",
        "r32-sketch-mean-seed0-cs-rows0.05-bn",
        "r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto",
        "r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto-d100000",
        "r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000",
        "r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000-probe-auto",
    ]
    for key, stored in KEY_HISTORY:
        assert Representation.from_stored(dict(stored)).key() == key
    # a new default is a new line of the history (a setting added since, at the value that changes nothing, is not)
    assert Representation.from_stored(dict(KEY_HISTORY[-1][1])) == Representation()
    assert Representation().key() == KEY_HISTORY[-1][0]


def test_the_value_before_a_setting_existed_is_one_its_key_leaves_out():
    """``until_added`` (the value a key stored before the setting existed stands for) and ``omit`` (values left out of
    the key) are two meanings, declared apart; a declaration whose ``until_added`` the key would show is refused."""
    from modelvec.core.settings import setting

    for field, meta in settings_of(Representation):
        assert not meta.until_added or meta.until_added[0] in meta.omit, field.name
    with pytest.raises(ValueError, match="must be left out of the key"):
        setting(0, "A setting added later.", key="x{}", omit=(1,), until_added=(0,))
    assert setting(0, "Left out, there from the start.", key="x{}", omit=(0,)).metadata  # omit alone is fine


def test_validation_and_flags_come_from_the_declaration():
    with pytest.raises(ValueError, match=r"rows must be a number in \(0, 1\] or auto, not 0.0"):
        Representation(rows=0)
    with pytest.raises(ValueError, match=r"rows must be a number in \(0, 1\] or auto, not 'half'"):
        Representation(rows="half")
    assert Representation(rows=1).rows == 1.0 and Representation(rows="auto").rows == "auto"
    assert flags(Representation(rows=0.1)) == ["--rows", "0.1"]
    assert flags(Representation(rows=1), Representation(rows=0.1)) == ["--rows", "1"]
    with pytest.raises(ValueError, match="metric must be one of cosine, euclidean"):
        Scoring(metric="manhattan")
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        Scoring(k=0)
    assert flags(Representation(rank=16, block_norm=False, projection="gaussian")) == [
        "--rank",
        "16",
        "--projection",
        "gaussian",
        "--no-block-norm",
    ]


ADDED_FIELD = """
import dataclasses, json, sys
from typer.testing import CliRunner
from modelvec.core.settings import setting
from modelvec.represent import representation as mod

base = mod.Representation
Extended = dataclasses.make_dataclass(
    "Representation",
    [("fancy", int, setting(0, "A setting added in one place.", minimum=0, key="fancy{}", order=99, omit=(0,)))],
    bases=(base,),
    frozen=True,
)
Extended.__module__ = base.__module__
mod.Representation = Extended  # before the CLI is built from it

from modelvec.cli import app  # noqa: E402

root, tiny, ft = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
for command in ("embed", "cluster", "neighbors"):
    out[command] = CliRunner().invoke(app, [command, "--help"]).output
store = f"{root}/s.duckdb"
args = ["embed", ft, "--base", tiny, "--store", store, "--fancy", "3", "--json"]
out["embed-json"] = json.loads(CliRunner().invoke(app, args).output)
args = ["neighbors", ft, "--store", store, "--fancy", "3", "--json"]
out["neighbors-json"] = json.loads(CliRunner().invoke(app, args).output)
bad = CliRunner().invoke(app, ["neighbors", ft, "--store", store, "--fancy", "-1"])
out["bad"] = [bad.exit_code, " ".join(bad.output.replace("│", " ").split())]
print(json.dumps(out))
"""


def test_a_field_added_to_the_representation_is_an_option_of_every_command_and_part_of_the_key(
    tiny_bert, tiny_finetunes, tmp_path
):
    """What adding a setting takes: one field (its help, bounds and place in the key). Every representation command
    then offers it, validates it and names the vectors by it, with nothing else edited."""
    script = tmp_path / "added.py"
    script.write_text(textwrap.dedent(ADDED_FIELD))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tiny_bert), str(tiny_finetunes[0])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for command in ("embed", "cluster", "neighbors"):
        said = " ".join(out[command].replace("│", " ").split())
        assert "--fancy" in said and "A setting added in" in said, command  # its help, wrapped beside its bounds
    assert len(out["embed-json"]["embedded"]) == 1
    assert out["neighbors-json"]["params"].endswith("-fancy3")
    code, said = out["bad"]
    assert code == 2 and "Invalid value for '--fancy'" in said  # refused as it is parsed


def test_settings_of_no_limit_many_values_and_a_registry_are_checked_as_declared():
    """``None`` where the default is ``None`` (no limit), tuples each checked (thresholds), and choices read from a
    registry when asked (engines): each refused with a line that says what it allows."""
    assert Scope().limit is None and Scope(limit=3).limit == 3
    with pytest.raises(ValueError, match="limit must be an integer >= 1, not 0"):
        Scope(limit=0)
    assert Ranks(thresholds=[0.5, 1]).thresholds == (0.5, 1.0)  # a list is a tuple, an int a float
    for bad in ((), 0.5, "0.5", (0.5, 0.0), (0.5, 1.5)):
        with pytest.raises(ValueError, match="thresholds"):
            Ranks(thresholds=bad)
    with pytest.raises(ValueError, match="engine must be one of local, ray, not 'spark'"):
        Execution(engine="spark")
    assert flags(Ranks(thresholds=(0.9, 0.99))) == ["--threshold", "0.9,0.99"]
    assert flags(Scope(limit=5, search=False)) == ["--limit", "5", "--no-search"]


def test_the_trees_thresholds_and_the_hubs_settings_are_checked_as_declared(monkeypatch):
    """The tree's rule and the Hub's settings refuse a value out of bounds or of the wrong type in one line, as every
    other settings object does; the Hub's waits still default from the environment, read when they are made."""
    assert TreeRule(merge_candidates=3).merge_candidates == 3 and TreeRule(unrelated_size=1).unrelated_size == 1.0
    for bad, said in (
        (dict(unrelated_size=0), r"unrelated_size must be a number > 0, not 0"),
        (dict(quantized_levels=1.5), r"quantized_levels must be a number in \(0, 1\], not 1.5"),
        (dict(merge_candidates=1), r"merge_candidates must be an integer >= 2, not 1"),
        (dict(merge_weight="0.1"), r"merge_weight must be a number, not '0.1'"),
        (dict(beyond=(1.6, 0.8)), r"beyond must be two numbers, the least below the most"),
    ):
        with pytest.raises(ValueError, match=said):
            TreeRule(**bad)
    assert HubSettings(retries=0, backoff=0, token=False).backoff == 0.0
    assert HubSettings(token="hf_x").token == "hf_x" and HubSettings(token=True).token is True
    for bad, said in (
        (dict(retries=-1), r"retries must be an integer >= 0, not -1"),
        (dict(retries=2.5), r"retries must be an integer, not 2.5"),
        (dict(backoff=-0.1), r"backoff must be a number >= 0, not -0.1"),
        (dict(timeout=0), r"timeout must be a number > 0, not 0"),
        (dict(token=3), r"token must be a string or true or false, not 3"),
        (dict(endpoint=8080), r"endpoint must be a string, not 8080"),
    ):
        with pytest.raises(ValueError, match=said):
            HubSettings(**bad)
    monkeypatch.setenv("MODELVEC_HUB_BACKOFF", "0.25")
    monkeypatch.setenv("MODELVEC_HUB_TIMEOUT", "3")
    assert (HubSettings().backoff, HubSettings().timeout) == (0.25, 3.0)
    monkeypatch.setenv("MODELVEC_HUB_BACKOFF", "-1")
    with pytest.raises(ValueError, match=r"backoff must be a number >= 0, not -1.0"):
        HubSettings()


def test_api_functions_take_the_settings_whole_or_one_by_one():
    """``discover(base, limit=2)`` is ``discover(base, Scope(limit=2))``; a name that is no setting is refused as a
    wrong keyword is."""
    from modelvec.core.settings import with_options

    assert with_options(Scope, None, {"limit": 2}) == Scope(limit=2)
    assert with_options(Scope, Scope(sort="likes"), {"limit": 2}) == Scope(sort="likes", limit=2)
    assert with_options(Scope, Scope(depth=2), {}) == Scope(depth=2)
    with pytest.raises(TypeError, match="discover\\(\\) got an unexpected keyword argument 'limt'"):
        with_options(Scope, None, {"limt": 2}, "discover")


def test_a_setting_given_two_ways_is_merged_where_they_agree_and_refused_where_they_conflict():
    """An object and its fields as keywords: one rule for every settings class and every function that takes both
    (the pipeline once dropped the keywords without a word)."""
    from modelvec import DeltaEmbedder
    from modelvec.analyse.scores import NEIGHBORS_SCORING
    from modelvec.core.settings import with_options

    # a field the object leaves at its default takes the keyword; the same value twice is no conflict
    assert with_options(Representation, Representation(rank=8), {"pooling": "concat"}) == Representation(
        rank=8, pooling="concat"
    )
    assert with_options(Representation, Representation(rank=8), {"rank": 8}) == Representation(rank=8)
    assert with_options(Representation, Representation(rows=1), {"rows": 1.0}) == Representation(rows=1)
    # a keyword that contradicts what the object sets: one line naming both
    with pytest.raises(ValueError, match=r"embed: rank=16 conflicts with Representation\(rank=8\) given with it"):
        with_options(Representation, Representation(rank=8), {"rank": 16}, "embed")
    # without an object, the keywords set the function's own defaults (neighbors lists 10)
    assert with_options(Scoring, None, {"metric": "euclidean"}, default=NEIGHBORS_SCORING).k == 10
    # every API function that takes both follows the rule
    assert DeltaEmbedder(Representation(rank=8), pooling="concat").representation.pooling == "concat"
    with pytest.raises(ValueError, match="conflicts"):
        DeltaEmbedder(Representation(rank=8), rank=4)


def test_keywords_of_several_settings_go_each_to_its_own():
    """``embed(..., rank=8, workers=4)``: each settings object takes its own fields; what is left is the caller's."""
    from modelvec.core.settings import taken_from

    options = {"rank": 8, "workers": 4, "device": "cpu", "store": "s.duckdb"}
    assert taken_from(Execution, options) == {"workers": 4, "device": "cpu"}
    assert taken_from(Representation, options) == {"rank": 8}
    assert options == {"store": "s.duckdb"}


@pytest.mark.parametrize(
    "command,cls,only",
    [
        ("discover", Scope, None),
        ("embed", Execution, None),
        ("embed", Scope, ("limit", "sort")),
        ("cluster", Reduction, None),
        ("cluster", Scoring, None),
        ("rank", Ranks, None),
    ],
)
def test_every_commands_options_are_its_settings_with_their_defaults(command, cls, only):
    """Each declared field is an option of the command with the declaration's flag and the API's default: one
    default per setting, the same in API and CLI."""
    import typer

    from modelvec.cli import app
    from modelvec.core.settings import flag_of, value_text

    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    options = {opt: p for p in click_command.params for opt in p.opts}
    for field, meta in settings_of(cls):
        if only is not None and field.name not in only:
            continue
        option = options[flag_of(field, meta)]
        default = field.default
        expected = [value_text(default)] if meta.many else default
        assert option.default == expected, (command, field.name)


def test_a_functions_declared_parameters_are_checked_where_it_is_called():
    """``validate_params``: a parameter checked as a settings field of its name, or by a function; the function gets
    the checked value, ``None`` passes where it is the default, and a bad value is refused in one line."""
    from modelvec.analyse.inputs import integer
    from modelvec.analyse.scores import predict_datasets
    from modelvec.core.settings import validate_params

    @validate_params(k=Scoring, row=integer(0))
    def pick(k: int = 5, row: int | None = None) -> tuple[int, int | None]:
        return k, row

    assert pick() == (5, None) and pick(3, row=2) == (3, 2)
    with pytest.raises(ValueError, match="k must be an integer >= 1, not 0"):
        pick(0)
    with pytest.raises(ValueError, match="row must be an integer >= 0, not -1"):
        pick(row=-1)
    with pytest.raises(TypeError, match="has no parameter 'kk'"):
        validate_params(kk=Scoring)(pick)
    with pytest.raises(ValueError, match="k must be an integer >= 1, not 0"):  # a score's boundary, before any work
        predict_datasets([[1.0]], [["a"]], k=0)
