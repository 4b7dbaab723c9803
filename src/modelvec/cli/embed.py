"""``modelvec embed``: Embed fine-tunes into the store (skips what is stored; records failures and goes on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import typer

from ..represent.representation import Representation
from .common import (
    EXIT_SOME_FAILED,
    JsonOpt,
    StoreOpt,
    WaitOpt,
    check_device,
    command,
    console,
    err,
    open_store,
    print_json,
    say,
    short_name,
    with_settings,
)


@command()
@with_settings(Representation, "representation")
def embed(
    targets: list[str] = typer.Argument(
        ...,
        metavar="MODEL",
        help="Fine-tunes (folders, weight files or Hub ids) with --base; "
        "or just BASE (a Hub id): every discovered fine-tune of it.",
    ),
    base: str | None = typer.Option(
        None, "--base", metavar="BASE", help="The base model the fine-tunes start from (path or Hub id)."
    ),
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    device: str = typer.Option(
        "auto",
        "--device",
        metavar="DEVICE",
        callback=check_device,
        help="torch device: auto (CUDA when a GPU is visible), cpu, cuda, cuda:N.",
    ),
    store: Path | None = StoreOpt,
    force: bool = typer.Option(False, "--force", help="Recompute models already stored."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, metavar="N", help="BASE mode: at most this many fine-tunes."
    ),
    sort: Literal["downloads", "likes", "created_at"] = typer.Option(
        "downloads", "--sort", help="BASE mode: which first."
    ),
    refresh: bool = typer.Option(False, "--refresh", help="BASE mode: run discovery again before embedding."),
    keep_weights: bool = typer.Option(
        True,
        "--keep-weights/--no-keep-weights",
        help="Keep Hub fine-tunes' files in the cache after embedding (the base always stays).",
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        metavar="N",
        help="local: I/O threads fetching the next models (default 2); "
        "ray: actors (default one per CPU of the cluster).",
    ),
    engine: Literal["local", "ray"] = typer.Option(
        "local", "--engine", help="local (threads here) or ray (a Ray cluster; pip install 'modelvec[ray]')."
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        metavar="HOST:PORT",
        help="--engine ray: the cluster (HEAD:6379 or auto); default a local one.",
    ),
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Embed fine-tunes into the store (skips what is stored; records failures and goes on; exit status 1 when some
    models failed).

    `modelvec embed --base BASE MODEL...` embeds the given models; `modelvec embed BASE` embeds
    every fine-tune of the Hub model BASE found by `modelvec discover` (run first when needed).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..run import embed as embed_models
    from ..run import embed_discovered

    if base is None and len(targets) != 1:
        raise typer.BadParameter(
            "give --base BASE with the models, or a single BASE to embed its discovered fine-tunes"
        )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with open_store(store, wait) as db, Progress(*columns, console=err, transient=False, disable=as_json) as bar:
        task = bar.add_task("embedding", total=len(targets) if base is not None else limit)
        common: dict[str, Any] = dict(
            representation=representation,
            device=device,
            store=db,
            force=force,
            progress=lambda *_: bar.advance(task),
            keep_weights=keep_weights,
            workers=workers,
            engine=engine,
            address=address,
            load=False,
        )
        if base is None:
            result = embed_discovered(targets[0], refresh=refresh, limit=limit, sort=sort, **common)
        else:
            result = embed_models(base, targets, **common)
    if as_json:
        print_json(result.as_json())
    else:
        for note, names in result.notes.items():
            say(err, f"note: {note} ({len(names)} model{'s' if len(names) > 1 else ''}, e.g. {names[0]})")
        for name, reason in result.failed.items():  # the model named as typed: a local folder relative to here
            shown = short_name(name) + reason[len(name) :] if reason.startswith(name) else reason
            say(console, f"  failed: {shown}")
        say(
            console,
            f"embedded {len(result.embedded)}, skipped {len(result.skipped)} (already stored), "
            f"failed {len(result.failed)} -> {db.path}",
        )
    if result.failed:  # exit 1: some models failed; the last line says which kind
        new = len(result.failed) - len(result.recorded)
        said = f"{new} new" + (
            f", {len(result.recorded)} recorded by an earlier run (--force tries again)" if result.recorded else ""
        )
        say(
            err,
            f"some models failed: {len(result.failed)} of {len(result.failed) + len(result.embedded) + len(result.skipped)} ({said})",
        )
        raise typer.Exit(EXIT_SOME_FAILED)
