"""The ``modelvec`` command line: a thin shell over the Python API.

Every command is one call of a public API function and the printing of what it returns; ``--json``
prints exactly the API's answer (``as_json()``). Failures are handled in one place
(:class:`_OneLineErrors`): a :class:`~modelvec.core.errors.ModelvecError` (a bad model, a busy or
damaged store, a Hub that does not answer, nothing stored: :class:`~modelvec.core.errors.NothingStoredError`)
or a ``ValueError`` (a bad option value) prints one line on stderr and exits with status 2.
Options that take several values accept them repeated or comma-separated
(``--threshold 0.5,0.9 --threshold 0.99``). Nothing heavy is imported until a command runs, so
``modelvec --help`` and ``modelvec show`` start without torch.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console
from rich.table import Column, Table
from typer.core import TyperGroup

from .analyse.scores import Scoring
from .core.errors import ModelvecError
from .core.settings import flag_of, settings_of
from .represent.representation import Representation

if TYPE_CHECKING:
    from .store import Store

console = Console()
err = Console(stderr=True)


def _say(console_: Console, text: str) -> None:
    console_.print(text, soft_wrap=True, markup=False, highlight=False)


class _OneLineErrors(TyperGroup):
    """Runs the command; a user-facing failure becomes one line on stderr and exit status 2 (bad input, not a crash)."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        try:
            return super().invoke(ctx)
        except (ModelvecError, ValueError) as exc:
            _say(err, f"error: {exc}")
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",  # a docstring paragraph is rewrapped to the terminal, not broken where the source breaks
    pretty_exceptions_enable=False,
    help="Turn fine-tuned transformers into vectors from their weight deltas.",
)

StoreOpt = typer.Option(None, "--store", help="DuckDB store (default: $MODELVEC_STORE or ./modelvec.duckdb).")
WaitOpt = typer.Option(
    None,
    "--wait",
    min=0,
    metavar="SECONDS",
    help="While another process uses the store, wait this long for it (default: $MODELVEC_STORE_WAIT or 600).",
)
JsonOpt = typer.Option(False, "--json", help="Print the API's answer as JSON instead of tables.")


def _split(values: list[str] | None) -> list[str]:
    """Repeated and comma-separated values as one list: ``["a,b", "c"]`` -> ``["a", "b", "c"]``."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def _numbers(values: list[str] | None) -> list[float]:
    out = []
    for part in _split(values):
        try:
            out.append(float(part))
        except ValueError:
            raise typer.BadParameter(f"{part!r} is not a number") from None
    return out


def _check_device(value: str) -> str:
    """A device option checked as it is parsed (before any progress is drawn): CUDA asked for without a GPU."""
    from .represent import resolve_device

    resolve_device(value)  # a ValueError: one line, exit 2 (see _OneLineErrors)
    return value


def _whole(header: str) -> Column:
    """A column whose cells are read or copied whole (names, representation keys, equations): wrapped, never cut."""
    return Column(header, overflow="fold", min_width=max(len(word) for word in header.split()))


def _short(name: str) -> str:
    """A stored model or base as the user likely typed it: relative to the working folder when inside it."""
    try:
        return str(Path(name).relative_to(Path.cwd()))
    except ValueError:
        return name


def _store(path: Path | None, wait: float | None = None) -> Store:
    """The store, opened now so that a wait for another process's run is said on one line before any progress bar."""
    from .store import Store

    return Store(path, wait=wait, on_wait=lambda line: _say(err, line))


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=_json_default))


def _json_default(value: object) -> object:
    import numpy as np

    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.3f}"
    return str(value)


def with_settings(
    cls: type,
    name: str,
    *,
    only: tuple[str, ...] | None = None,
    defaults: dict[str, Any] | None = None,
    helps: dict[str, str] | None = None,
) -> Any:
    """Give a command one option per field of the settings class ``cls`` (their help, choices and bounds
    come from the declaration: :mod:`modelvec.core.settings`); the command receives them built and
    validated, as ``name=cls(...)``. Adding a field to ``cls`` adds its option to every such command.

    ``only``: the fields the command uses (the others keep their defaults); ``defaults`` and ``helps``: where a
    command's default or meaning differs (``neighbors --k`` lists 10 neighbours)."""
    defaults, helps = defaults or {}, helps or {}

    def fields() -> list[tuple[Any, Any]]:
        return [(f, m) for f, m in settings_of(cls) if only is None or f.name in only]

    def decorate(func: Any) -> Any:
        signature = inspect.signature(func)
        added = []
        for field, meta in fields():
            flag = flag_of(field, meta)
            kind: type = type(field.default)
            if kind is bool:
                decls = [f"{flag}/{meta.negation or '--no-' + flag[2:]}"]
            else:
                decls = [flag]
            option = typer.Option(
                defaults.get(field.name, field.default),
                *decls,
                help=helps.get(field.name, meta.help),
                metavar=meta.metavar,
                min=meta.minimum,
                max=meta.maximum,
                show_default=True,
            )
            annotation = Literal[meta.choices] if meta.choices else kind  # typer lists a Literal's choices
            added.append(
                inspect.Parameter(
                    f"{name}__{field.name}",
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=option,
                    annotation=annotation,
                )
            )
        before = list(signature.parameters.values())
        at = [p.name for p in before].index(name)  # the options stand where the command declares them
        parameters = [*before[:at], *added, *before[at + 1 :]]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {f.name: kwargs.pop(f"{name}__{f.name}") for f, _ in fields()}
            try:
                kwargs[name] = cls(**values)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
            return func(*args, **kwargs)

        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        annotations = {k: v for k, v in func.__annotations__.items() if k != name}
        command.__annotations__ = {**annotations, **{p.name: p.annotation for p in added}}
        return command

    return decorate


@app.command()
@with_settings(Representation, "representation")
def embed(
    targets: list[str] = typer.Argument(
        ...,
        help="Fine-tunes (folders, weight files or Hub ids) with --base; "
        "or just BASE (a Hub id): every discovered fine-tune of it.",
    ),
    base: str | None = typer.Option(None, "--base", help="The base model the fine-tunes start from (path or Hub id)."),
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    device: str = typer.Option(
        "auto", callback=_check_device, help="torch device: auto (CUDA when a GPU is visible), cpu, cuda, cuda:N."
    ),
    store: Path | None = StoreOpt,
    force: bool = typer.Option(False, "--force", help="Recompute models already stored."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="BASE mode: at most this many fine-tunes."),
    sort: str = typer.Option("downloads", "--sort", help="BASE mode: which first: downloads|likes|created_at."),
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
        help="local: I/O threads fetching the next models (default 2); "
        "ray: actors (default one per CPU of the cluster).",
    ),
    engine: str = typer.Option(
        "local", "--engine", help="local (threads here) or ray (a Ray cluster; pip install 'modelvec[ray]')."
    ),
    address: str | None = typer.Option(
        None, "--address", help="--engine ray: the cluster (HEAD:6379 or auto); default a local one."
    ),
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Embed fine-tunes into the store (skips what is stored; records failures and goes on).

    `modelvec embed --base BASE MODEL...` embeds the given models; `modelvec embed BASE` embeds
    every fine-tune of the Hub model BASE found by `modelvec discover` (run first when needed).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .run import embed as embed_models
    from .run import embed_discovered

    if base is None and len(targets) != 1:
        raise typer.BadParameter(
            "give --base BASE with the models, or a single BASE to embed its discovered fine-tunes"
        )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with _store(store, wait) as db, Progress(*columns, console=err, transient=False, disable=as_json) as bar:
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
        _print_json(result.as_json())
        return
    _say(
        console,
        f"embedded {len(result.embedded)}, skipped {len(result.skipped)} (already stored), "
        f"failed {len(result.failed)} -> {db.path}",
    )
    for reason in result.failed.values():
        _say(console, f"  failed: {reason}")
    for note, names in result.notes.items():
        _say(err, f"note: {note} ({len(names)} model{'s' if len(names) > 1 else ''}, e.g. {names[0]})")
    if result.failed and not result.embedded and not result.skipped:
        raise typer.Exit(1)


@app.command()
def discover(
    base: str = typer.Argument(
        ..., help="The base model on the Hub: bert-base-uncased, google-bert/bert-base-uncased, ..."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Keep at most this many fine-tunes."),
    sort: str = typer.Option("downloads", "--sort", help="Listing order: downloads|likes|created_at|last_modified."),
    search: bool = typer.Option(
        True, "--search/--no-search", help="Also search by name and keep candidates whose config matches the base."
    ),
    show_rejected: bool = typer.Option(False, "--rejected", help="Also list the rejected candidates and why."),
    as_json: bool = JsonOpt,
    store: Path | None = StoreOpt,
) -> None:
    """Find the fine-tunes of BASE on the Hub (HF_ENDPOINT) and store the catalogue; vectors are kept."""
    from .run import discover as find

    with _store(store) as db:
        found = find(base, limit=limit, sort=sort, search=search, store=db)
    if as_json:
        _print_json(found.as_json())
        return
    table = Table(
        _whole("model"),
        "downloads",
        _whole("datasets"),
        "labels from",
        "author",
        "why kept",
        title=f"fine-tunes of {found.base} @ {found.base_sha[:12]}",
    )
    for e in found.kept:
        table.add_row(
            e.model,
            str(e.downloads if e.downloads is not None else "-"),
            ", ".join(e.datasets) or "-",
            e.label_source or "-",
            e.author or "-",
            e.reason,
        )
    console.print(table)
    if show_rejected and found.rejected:
        rejected = Table(_whole("model"), "why rejected", title="rejected candidates")
        for e in found.rejected:
            rejected.add_row(e.model, e.reason)
        console.print(rejected)
    _say(console, f"kept {len(found.kept)}, rejected {len(found.rejected)} -> catalogue in {db.path}")


@app.command()
def show(
    store: Path | None = StoreOpt,
    failures: bool = typer.Option(True, help="Also list failures."),
    as_json: bool = JsonOpt,
) -> None:
    """List what is stored: vectors per base and representation, and failures (with their kind)."""
    with _store(store) as db:
        overview = db.overview()
    if as_json:
        _print_json(overview.as_json())
        return
    table = Table(
        _whole("base"),
        _whole("representation"),
        "architecture",
        "models",
        "dim",
        "s/model",
        title=f"vectors in {db.path} (s/model: mean seconds to embed one)",
    )
    default = Representation().key()
    for row in overview.summary.itertuples():
        key = row.params + (" (default)" if row.params == default else "")
        table.add_row(_short(row.base), key, row.architecture, str(row.models), str(row.dim), f"{row.mean_seconds:.3f}")
    console.print(table)
    if not overview.models.empty:
        models = Table(_whole("model"), _whole("datasets"), "vectors", "s/vector", title="models (s/vector: mean)")
        for model, rows in overview.models.groupby("model", sort=True):  # one row per model, not per vector
            datasets = sorted({d for ds in rows["datasets"] for d in ds})
            models.add_row(
                _short(str(model)), ", ".join(datasets) or "-", str(len(rows)), f"{rows['seconds'].mean():.2f}"
            )
        console.print(models)
    if failures and not overview.failures.empty:
        table = Table(
            _whole("model"),
            "kind",
            "error",
            title="failures (content: skipped while the weights are unchanged; "
            "resource, transient: tried again next run)",
        )
        for row in overview.failures.itertuples():
            table.add_row(_short(row.model), row.kind, row.error)
        console.print(table)


@app.command()
def export(
    parquet: Path = typer.Option(..., "--parquet", help="Parquet file to write."),
    store: Path | None = StoreOpt,
) -> None:
    """Write one row per stored vector: model, base, representation parameters, datasets, vector."""
    with _store(store) as db:
        count = db.export_parquet(parquet)
    _say(console, f"wrote {count} vectors to {parquet}")


@app.command()
def compact(store: Path | None = StoreOpt) -> None:
    """Drop the bytes of replaced vectors from the store's vector file (safe to interrupt)."""
    with _store(store) as db:
        before, after = db.compact()
    _say(console, f"{db.vector_file.path.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")


@app.command()
@with_settings(Representation, "representation")
@with_settings(Scoring, "scoring")
def cluster(
    base: str = typer.Argument(..., help="The base whose stored fine-tunes to cluster (path or stored id)."),
    reduce: str = typer.Option("umap", "--reduce", help="2-D map: umap|tsne|pca."),
    standardize: bool = typer.Option(False, "--standardize", help="Standardise features before the map."),
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    out: Path = typer.Option(Path("modelvec-out"), "--out", help="Folder for the PNG and HTML maps."),
    as_json: bool = JsonOpt,
    label_source: list[str] | None = typer.Option(
        None,
        "--label-source",
        help="Keep only labels from these sources: card|model-index|tag|name|declared|guessed "
        "(repeated or comma-separated).",
    ),
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
) -> None:
    """Score how well the stored vectors of BASE cluster by dataset, and draw the maps."""
    from .report import cluster as run_cluster

    report = run_cluster(
        base,
        representation=representation,
        scoring=scoring,
        store=store,
        out=out,
        reduce=reduce,
        standardize=standardize,
        label_sources=_split(label_source) or None,
    )
    if as_json:
        _print_json(report.as_json())
        return
    table = Table("dataset", "models scored", "kNN dataset score", title=f"{_short(report.base)} · {report.params}")
    for dataset, entry in sorted(report.per_dataset.items()):
        table.add_row(dataset, str(entry["count"]), _fmt(entry["score"]))
    table.add_row("[b]all[/b]", str(report.n_scored), f"[b]{_fmt(report.knn_score)}[/b]")
    console.print(table)
    how = f"metric {report.metric}" + (f" · {report.scaling}" if report.scaling != "none" else "")
    scores = Table("score", "value", title=f"{report.n_models} models · {how} · pool {report.pool}")
    scores.add_row("leave-one-out dataset prediction accuracy", _fmt(report.loo_accuracy))
    if report.n_authors:
        scores.add_row(
            f"kNN score, same-author neighbours excluded ({report.n_scored_other_authors} scored)",
            _fmt(report.knn_score_other_authors),
        )
        scores.add_row(f"authors ({report.n_authors}): share of the most prolific", _fmt(report.largest_author_share))
    for name, value in report.clustering.items():
        scores.add_row(name, _fmt(int(value) if name.startswith("n_") else value))  # a count, kept float in the API
    console.print(scores)
    if report.predictions:
        preds = Table("unlabelled model", "predicted dataset", "confidence")
        for p in report.predictions:
            preds.add_row(_short(p["model"]), p["predicted"], _fmt(p["confidence"]))
        console.print(preds)
    if report.per_block:
        best = sorted(report.per_block, key=lambda b: -b["knn_score"])[:3]
        names = ", ".join(
            f"{b['family']}{'' if b['layer'] is None else ' layer ' + str(b['layer'] + 1)} {b['knn_score']:.2f}"
            for b in best
        )
        _say(console, f"blocks that separate the datasets best (kNN score of the block alone): {names}")
    for kind, path in report.files.items():
        _say(console, f"{kind.upper()} map: {path}" if kind != "blocks" else f"per-block kNN heat map: {path}")


@app.command()
@with_settings(Representation, "representation")
@with_settings(
    Scoring,
    "scoring",
    only=("metric", "scaling", "k"),
    defaults={"k": 10},
    helps={"k": "How many nearest stored models are listed (and vote for the predicted dataset)."},
)
def neighbors(
    model: str = typer.Argument(..., help="A model: stored, or a local folder or Hub id to embed on the fly."),
    base: str | None = typer.Option(None, "--base", help="The stored base to compare against (default: the only one)."),
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    as_json: bool = JsonOpt,
    explain: bool = typer.Option(
        False, "--explain", help="Show which layers and families carry the similarity to each neighbour."
    ),
) -> None:
    """The stored models nearest to MODEL, with distance and labels, and its predicted dataset.

    A model that is not in the store is embedded now with the same representation against the
    stored base, compared, and not stored.
    """
    from .report import neighbors as find

    found = find(model, representation=representation, scoring=scoring, store=store, base=base, explain=explain)
    if as_json:
        _print_json(found.as_json())
        return
    if found.on_the_fly:
        _say(
            err,
            f"{_short(found.query)} is not in the store: embedded now ({found.params}, base {_short(found.base)}), "
            "not stored",
        )
    if found.warning:
        _say(err, f"warning: {found.warning}")
    table = Table(
        "#",
        _whole("model"),
        f"{scoring.metric} distance",
        _whole("datasets"),
        "author",
        title=f"nearest to {_short(found.query)}",
    )
    for i, row in enumerate(found.nearest.itertuples(), 1):
        table.add_row(
            str(i),
            _short(row.model),
            f"{row.distance:.4f}",
            ", ".join(row.datasets) or "-",
            row.author if isinstance(row.author, str) else "-",
        )
    console.print(table)
    if found.predicted is None:
        console.print("predicted dataset: none (no labelled neighbour)")
    else:
        votes = ", ".join(f"{name} {n}" for name, n in found.votes.items())
        console.print(
            f"predicted dataset: [bold]{found.predicted}[/bold] (confidence {found.confidence:.2f}; "
            f"votes of the {scoring.k} nearest labelled models: {votes})"
        )
    for item in found.explanation or []:
        families = ", ".join(f"{f} {v:+.3f}" for f, v in sorted(item["by_family"].items(), key=lambda kv: -kv[1]))
        line = f"{_short(item['model'])}: cosine {item['cosine']:.3f} = families {families}"
        if any(b["layer"] is not None for b in item["blocks"]):  # with layers averaged the blocks are the families
            top = ", ".join(
                f"{b['family']}{'' if b['layer'] is None else ' L' + str(b['layer'] + 1)} {b['share']:+.3f}"
                for b in item["blocks"][:5]
            )
            line += f"; top blocks {top}"
        _say(console, line)


@app.command()
@with_settings(Scoring, "scoring", only=("metric", "k"))
def evaluate(
    models: list[Path] = typer.Argument(
        ..., help="Fine-tuned models (or LoRA adapters) with dataset labels in their cards."
    ),
    base: Path = typer.Option(..., "--base", help="The base model."),
    scoring: Scoring = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    as_json: bool = JsonOpt,
    markdown: Path | None = typer.Option(None, "--markdown", help="Also write the table as Markdown."),
    selection: list[str] | None = typer.Option(
        None,
        "--selection",
        help="Datasets of the selection half, repeated or comma-separated (default: half of them, fixed by name).",
    ),
    split: bool | None = typer.Option(
        None, "--split/--no-split", help="Score a selection and a report half (default: with 4 or more datasets)."
    ),
    ranks: list[str] = typer.Option(
        [str(Representation.rank)],
        "--ranks",
        help="Ranks of the variants, repeated or comma-separated: --ranks 8,16,32.",
    ),
    center: bool = typer.Option(False, "--center", help="Also score every variant centred on the models' mean."),
    mutual_proximity: bool = typer.Option(
        False,
        "--mutual-proximity",
        help="Also score every variant with neighbours ranked by mutual proximity (for adapters beside full fine-tunes).",
    ),
    vocabulary_head: bool = typer.Option(
        False, "--vocabulary-head", help="Also score the sketches with the head's vocabulary prior appended (--head)."
    ),
    rows: list[str] = typer.Option(
        ["1"], "--rows", help="Shares of rows the sketches read, repeated or comma-separated: --rows 1,0.1,0.05."
    ),
    projections: list[str] = typer.Option(
        ["shared"],
        "--projections",
        help="The sketches' projections, repeated or comma-separated: --projections shared,gaussian,countsketch.",
    ),
    svd: bool = typer.Option(True, "--svd/--no-svd", help="Also score the SVD factors (U, U·Σ, singular values)."),
    seeds: list[str] = typer.Option(
        ["0"], "--seeds", help="Seeds of every variant, repeated or comma-separated; scores are their mean and spread."
    ),
) -> None:
    """Embed MODELS with every representation and print their scores side by side.

    With a split, the method picked on the selection half is marked, and the report half's kNN score
    comes with a 95 % bootstrap interval over models.
    """
    from .studies import evaluate as run_evaluate
    from .studies import variants

    table = run_evaluate(
        base,
        models,
        variants=variants(
            tuple(int(r) for r in _split(ranks)),
            vocabulary_head=vocabulary_head,
            rows=tuple(_numbers(rows)),
            projections=tuple(_split(projections)),
            svd=svd,
        ),
        seeds=tuple(int(x) for x in _numbers(seeds)),
        store=store,
        scoring=scoring,
        progress=lambda msg: _say(err, msg),
        split=split,
        selection=_split(selection) if selection else None,
        center=center,
        mutual_proximity=mutual_proximity,
    )
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
    if as_json:
        _print_json(table.to_dict(orient="records"))
        return
    extra = [c for c in ("knn_full", "knn_adapters", "adapter_to_full") if c in table.columns]
    if table["knn_spread"].any():
        extra.append("knn_spread")
    shown = ["method", "half", "dim", "seconds_per_model", "knn_score", "knn_lo", "knn_hi", "loo_accuracy", "ref_corr"]
    shown += extra
    picked = table[table["selected"]]["method"].iloc[0]
    if not console.is_terminal:  # a log or a pipe: a Markdown table stays readable at any width
        print(table[shown].to_markdown(index=False, floatfmt=".3f"))
    else:
        out = Table(*[c.replace("_", " ") for c in shown], title=f"representations compared on {len(models)} models")
        for row in table[shown].itertuples(index=False):
            out.add_row(*(_fmt(v) for v in row))
        console.print(out)
        console.print("all columns: --json or --markdown FILE", style="dim")
    first = table["half"].iloc[0]
    _say(console, f"best kNN score on {'all models' if first == 'all' else 'the ' + first + ' half'}: {picked}")
    for row in table[table["selected"]].itertuples(index=False):
        where = "all models" if row.half == "all" else f"{row.half} half"
        _say(console, f"  {where}: kNN score {row.knn_score:.3f} [95 % CI {row.knn_lo:.3f}, {row.knn_hi:.3f}]")


@app.command()
def rank(
    model: str | None = typer.Argument(None, help="The model whose matrices to study (folder, weights file or .gguf)."),
    base: Path | None = typer.Option(None, "--base", help="The base, for --of delta."),
    of: str = typer.Option("weights", "--of", help="Study the weights W, or the delta W - W_base: weights|delta."),
    threshold: list[str] = typer.Option(
        ["0.5,0.9,0.99"],
        "--threshold",
        help="Energy thresholds, repeated or comma-separated: --threshold 0.5,0.9,0.99.",
    ),
    over_finetunes: str | None = typer.Option(
        None, "--over-finetunes", metavar="BASE", help="Study the deltas of every stored fine-tune of BASE."
    ),
    out: Path = typer.Option(Path("modelvec-out/rank"), "--out", help="Folder for the figures, CSV and JSON."),
    as_json: bool = JsonOpt,
    store: Path | None = StoreOpt,
) -> None:
    """How the rank of every matrix changes with depth: figures per threshold, every value, fitted laws."""
    from .report import depth_report

    study = depth_report(
        model, base=base, of=of, thresholds=_numbers(threshold), over_finetunes=over_finetunes, store=store, out=out
    )
    for reason in study.failed.values():
        _say(err, f"failed: {reason}")
    for warning in study.warnings:
        _say(err, f"warning: {warning}")
    if as_json:
        _print_json(study.records())
        return
    table = Table(
        "stack",
        "family",
        "threshold",
        _whole("best law (adj. R²)"),
        _whole("equation"),
        _whole("runner-up"),
        title=f"rank of {'ΔW' if study.of == 'delta' else 'W'} across depth: {_short(study.model)}",
    )
    for (stack, family, t), fits in study.fits.items():
        best, second = fits[0], (fits[1] if len(fits) > 1 else None)
        table.add_row(
            stack,
            family,
            f"{t:g}",
            f"{best.name} ({_fmt(best.adj_r2)})",
            best.equation,
            f"{second.name} ({_fmt(second.adj_r2)})" if second else "-",
        )
    console.print(table)
    for kind, path in study.files.items():
        _say(console, f"{kind}: {path}")


def main() -> None:
    """The console script: ``modelvec ...``."""
    app(prog_name="modelvec")


if __name__ == "__main__":  # pragma: no cover
    main()
