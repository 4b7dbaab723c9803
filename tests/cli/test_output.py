"""Output for people and for logs: no model id split mid-name, in a narrow terminal or in a pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console
from rich.table import Table

from modelvec.cli.printing import print_table, say, whole_column

LONG = "newsroom-lab/all-MiniLM-L6-v2-bbc-news-sentence-pairs-trainer-s3"


def terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, force_terminal=True, color_system=None), buffer


def models_table() -> Table:
    table = Table(whole_column("model"), whole_column("datasets"), "vectors", title="models")
    table.add_row(LONG, "bbc-news-sentence-pairs", "1")
    table.add_row("alice/short", "tweet-sentiment", "2")
    return table


def test_a_table_too_wide_for_the_terminal_becomes_records_with_whole_ids():
    out, buffer = terminal(80)
    print_table(out, models_table())
    lines = buffer.getvalue().splitlines()
    assert LONG in lines and "alice/short" in lines  # each id whole, on a line of its own
    assert "    datasets bbc-news-sentence-pairs · vectors 1" in lines
    assert all(len(line) <= 80 for line in lines)


def test_a_table_that_fits_stays_a_table():
    out, buffer = terminal(120)
    print_table(out, models_table())
    text = buffer.getvalue()
    assert "┃ model" in text and f"│ {LONG} │" in text


def test_a_message_wraps_at_spaces_in_a_terminal_never_inside_a_name():
    out, buffer = terminal(40)
    say(out, f"votes of the 5 nearest: tweet-simcse 4, {LONG[:30]} 1")
    lines = buffer.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 40 for line in lines)
    assert any(line.startswith(LONG[:30]) for line in lines)  # moved to the next line whole, not folded


def test_a_pipe_gets_whole_lines():
    code = (
        "from modelvec.cli.printing import console, say, LOG_WIDTH; "
        f"say(console, 'x ' * 100 + {LONG!r}); print(console.width == LOG_WIDTH)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    first, flag = got.splitlines()
    assert first == "x " * 100 + LONG and flag == "True"  # one line, however long: a log's lines are never cut


def test_how_near_a_prediction_is_in_words():
    """A closeness just short of 1 (a neighbour at about the typical distance) reads as typical, not as farther."""
    from modelvec.cli.printing import how_near

    said = [how_near(c) for c in (1.0, 0.95, 0.7, 0.2, float("nan"))]
    assert len(set(said)) == 5
    assert "as near as" in said[0] and "about as near as" in said[1]
    assert "farther" in said[2] and "far" in said[3] and "too few" in said[4]
