"""Run every command the README and docs show, as written, after ``make demo``: offline, at 80 columns.

A command is a line starting with ``$ `` inside a fenced ``console`` block of README.md or docs/*.md; the lines
after it, up to the next command or the end of the block, are its output as shown. A command must exit with
status 0 (or the status its block names: ```` ```console exit=1 ````), print no traceback, and print every
line shown (spaces aside; a line with "…" is an elision and is skipped). Synopses with placeholders (BASE,
MODEL...) live in ``text`` blocks and are not run.

    python demo/check_docs.py [FILES...]        # make demo runs it last

The commands run in the repository's root with the demo's Hub cache (HF_HUB_CACHE=.cache/hf, as the README
says to set it) and no Hub: HF_HUB_OFFLINE=1 and no HF_ENDPOINT, so a command that would reach the Hub fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```console(?:\s+exit=(\d+))?\s*$")
#: What the README's quick start makes in the repository's root: removed first, so its output is a first run's.
MADE = ("mine.duckdb", "mine.duckdb.wal", "mine.duckdb.vectors", "my-map")


@dataclass
class Shown:
    """One command of the docs and the output they show for it."""

    where: str
    command: str
    status: int
    output: list[str] = field(default_factory=list)


def shown_commands(path: Path) -> list[Shown]:
    found: list[Shown] = []
    inside, status = False, 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if not inside and fence:
            inside, status = True, int(fence.group(1) or 0)
        elif inside and line.startswith("```"):
            inside = False
        elif inside and line.startswith("$ "):
            found.append(Shown(f"{path.relative_to(ROOT)}:{number}", line[2:].strip(), status))
        elif inside and found and line.strip():
            found[-1].output.append(line)
    return found


def words(text: str) -> str:
    return " ".join(text.split())


def check(item: Shown, env: dict[str, str]) -> list[str]:
    """What is wrong with running ``item`` (nothing: an empty list)."""
    started = time.perf_counter()
    ran = subprocess.run(["bash", "-c", item.command], cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - started
    said = ran.stdout + ran.stderr
    print(f"{item.where}: $ {item.command}  [exit {ran.returncode}, {took:.1f} s]", flush=True)
    problems = []
    if ran.returncode != item.status:
        problems.append(f"exit status {ran.returncode}, the docs expect {item.status}")
    if "Traceback" in said:
        problems.append("printed a traceback")
    flat = words(said)
    for line in item.output:
        if "…" not in line and words(line) not in flat:
            problems.append(f"did not print the line shown: {line.strip()}")
    if problems:
        tail = "\n".join(said.strip().splitlines()[-15:])
        problems.append(f"its output ended:\n{tail}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md).")
    args = parser.parse_args()
    files = [f.resolve() for f in args.files] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "MODELVEC_STORE")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(ROOT / ".cache/hf"), COLUMNS="80")
    env["PATH"] = f"{ROOT / '.venv/bin'}{os.pathsep}{env.get('PATH', '')}"
    items = [item for path in files for item in shown_commands(path)]
    for name in MADE:
        made = ROOT / name
        shutil.rmtree(made) if made.is_dir() else made.unlink(missing_ok=True)
    failed = 0
    for item in items:
        problems = check(item, env)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        failed += bool(problems)
    print(f"{len(items) - failed} of {len(items)} commands shown in the docs work as shown")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
