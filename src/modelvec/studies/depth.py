"""The depth study: how the energy rank of every weight matrix (or of its fine-tuning delta) changes with depth.

For each stack, layer and family: all squared singular values (exact to float64, from the float64
Gram matrix's eigenvalues: see :mod:`modelvec.spectra.energy`), and r(t) = the smallest r with sum_{i<=r} s_i^2 / sum s_i^2 >= t, also as a fraction
of min(n, m). GPT-2's fused ``c_attn`` is studied both whole (family ``qkv``, as the original
gpt2-medium study did) and split into q, k, v.

Rules: the energies are summed in float64; a threshold counts as reached within a relative 1e-9
(so t = 1.0 gives the number of non-negligible singular values instead of depending on the last
bit of a float sum); a zero matrix has rank 0 at every threshold.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analyse.laws import Fit
from ..core.errors import CheckpointError, FetchError, IncompatibleError, ModelvecError, NothingStoredError
from ..core.names import model_id
from ..hub.ids import resolve_base
from ..read import Checkpoint, Layout, MatrixRef, check_compatible, open_checkpoint
from ..read.gguf import refuse_quantized_delta, warn_if_quantized
from ..represent import resolve_device
from ..run import local_files
from ..spectra.energy import DEFAULT_THRESHOLDS, as_float64, fused_gram_energies, fuses_by_gram, gram_energies
from ..spectra.tables import Spectrum, aggregate_energy_ranks, energy_rank_table, fit_depth_laws
from ..store import Store, opened

PathLike = str | os.PathLike[str]
KINDS = ("weights", "delta")
_MAX_BATCH_BYTES = 256 * 2**20  # bounded memory whatever the model size


def _shape(w: torch.Tensor) -> tuple[int, int]:
    return (int(w.shape[0]), int(w.shape[1]))


def _refs(layout: Layout, fused: bool) -> list[MatrixRef]:
    """The layout's matrices, plus each fused tensor whole (e.g. GPT-2's c_attn as ``qkv``)."""
    refs = []
    for ref in layout.refs:
        if fused and ref.fused and ref.part == 0:
            refs.append(dataclasses.replace(ref, family=ref.fused, part=0, n_parts=1))
        refs.append(ref)
    return refs


def spectra_of(
    model: PathLike | Checkpoint,
    *,
    base: PathLike | Checkpoint | None = None,
    of: str = "weights",
    fused: bool = True,
    device: str = "auto",
) -> list[Spectrum]:
    """Singular values of every matrix of ``model`` (``of="weights"``) or of its delta to ``base``.

    A ``.gguf`` file is read dequantized (``quantized.GGUFCheckpoint``); when quantized, its weights'
    study warns (``QuantizationWarning``: the noise raises the measured rank) and a delta is refused.
    """
    if of not in KINDS:
        raise ValueError(f"of must be one of {', '.join(KINDS)}, not {of!r}")
    device = str(resolve_device(device))
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    layout = ck.layout()
    base_ck = base_layout = None
    if of == "delta":
        if base is None:
            raise ValueError("of='delta' needs a base")
        base_ck = base if isinstance(base, Checkpoint) else open_checkpoint(base)
        base_layout = base_ck.layout()
        check_compatible(ck, layout, base_layout)
        refuse_quantized_delta(ck)
        refuse_quantized_delta(base_ck)
    else:
        warn_if_quantized(ck)
    refs = _refs(layout, fused)
    by_shape: dict[tuple[int, int], list[tuple[MatrixRef, torch.Tensor]]] = {}
    groups: list[tuple[MatrixRef, list[MatrixRef], list[torch.Tensor]]] = []
    cache: dict[str, torch.Tensor] = {}
    base_cache: dict[str, torch.Tensor] = {}
    out: dict[tuple[str, int, str], Spectrum] = {}

    def record(ref: MatrixRef, shape: tuple[int, int], e: np.ndarray) -> None:
        if not np.isfinite(e).all():
            raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
        out[(ref.stack, ref.layer, ref.family)] = Spectrum(ref.stack, ref.layer, ref.family, shape, e)

    def flush(shape: tuple[int, int]) -> None:
        items = by_shape.pop(shape, [])
        if items:
            for (ref, _), e in zip(items, gram_energies([m for _, m in items], device)):
                record(ref, shape, e)

    def flush_groups() -> None:
        for (whole, parts, mats), values in zip(groups, fused_gram_energies([g[2] for g in groups])):
            shapes = [_shape(m) for m in mats]
            shapes.append((shapes[0][0], sum(m for _, m in shapes)))  # the blocks side by side
            for ref, shape, e in zip([*parts, whole], shapes, values):
                record(ref, shape, e)
        groups.clear()

    def read(ref: MatrixRef) -> torch.Tensor:
        w = ck.matrix(ref, layout.prefix, cache, stored=True)  # a view of the mapped file, converted per matrix
        if base_ck is not None and base_layout is not None:
            w0 = base_ck.matrix(ref, base_layout.prefix, base_cache, stored=True)
            if w.shape != w0.shape:
                raise IncompatibleError(
                    ck.name,
                    f"tensor {layout.prefix + ref.tensor} has shape {list(w.shape)}, the base's has {list(w0.shape)}",
                )
            # exact: the float64 difference of two float32/bf16 values
            w = torch.from_numpy(as_float64(w) - as_float64(w0))
        return w

    on_cpu = torch.device(device).type == "cpu"
    parts_of: dict[str, list[MatrixRef]] = {}
    for r in refs:
        if r.n_parts > 1:
            parts_of.setdefault(r.tensor, []).append(r)
    grouped: set[str] = set()  # fused tensors whose parts went with their whole
    for ref in refs:
        if ref.n_parts > 1 and ref.tensor in grouped:
            continue
        parts = parts_of.get(ref.tensor, []) if ref.n_parts == 1 and ref.fused else []
        # a fused tensor studied whole and in parts: on the CPU, the whole's Gram is the sum of the parts'
        if on_cpu and parts and fuses_by_gram([_shape(ck.matrix(p, layout.prefix, cache, stored=True)) for p in parts]):
            groups.append((ref, parts, [read(p) for p in parts]))
            grouped.add(ref.tensor)
            if sum(m.numel() for g in groups for m in g[2]) * 8 >= _MAX_BATCH_BYTES:
                flush_groups()
            continue
        w = read(ref)
        shape = _shape(w)
        by_shape.setdefault(shape, []).append((ref, w))
        if len(by_shape[shape]) * shape[0] * shape[1] * 8 >= _MAX_BATCH_BYTES:
            flush(shape)
    flush_groups()
    for shape in list(by_shape):
        flush(shape)
    return [out[(r.stack, r.layer, r.family)] for r in refs]


@dataclass
class DepthStudy:
    """A depth study's table (every value), fitted laws and written files."""

    model: str
    of: str
    table: pd.DataFrame
    spectra: list[Spectrum]
    fits: dict[tuple[str, str, float], list[Fit]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    n_models: int = 1  # fine-tunes aggregated (over_finetunes)
    failed: dict[str, str] = field(default_factory=dict)  # fine-tunes that could not be read: model -> reason
    warnings: list[str] = field(default_factory=list)  # e.g. the weights are quantized (report.rank records them)

    def records(self) -> list[dict]:
        return self.table.to_dict(orient="records")


def depth_study(
    model: PathLike,
    *,
    base: PathLike | None = None,
    of: str = "weights",
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
) -> DepthStudy:
    """The depth study of one model's weights, or of its delta to ``base``."""
    items = spectra_of(model, base=base, of=of, device=device)
    table = energy_rank_table(items, thresholds)
    return DepthStudy(str(model), of, table, items, fit_depth_laws(table))


def over_finetunes(
    base: PathLike,
    models: Sequence[PathLike],
    *,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
    name: str | None = None,
) -> tuple[DepthStudy, dict[str, str]]:
    """The depth study of the deltas of many fine-tunes of ``base``: mean and spread per family and layer.

    Returns the aggregated study and the models that failed (model -> reason); the others go on.
    ``name`` is how the base is shown (e.g. its Hub id when ``base`` is a cache folder).
    """
    base_ck = open_checkpoint(base)
    tables, failed, first = [], {}, None
    for model in models:
        try:
            items = spectra_of(model, base=base_ck, of="delta", device=device)
        except (CheckpointError, IncompatibleError) as exc:
            failed[str(model)] = str(exc)
            continue
        first = first or items
        tables.append(energy_rank_table(items, thresholds))
    if not tables:
        raise ValueError(f"{base}: none of the {len(models)} fine-tunes could be read")
    table = aggregate_energy_ranks(tables)
    study = DepthStudy(
        name or str(base), "delta", table, [], fit_depth_laws(table), n_models=len(tables), failed=failed
    )
    return study, failed


def over_stored(
    base: str,
    *,
    store: Store | PathLike | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
) -> DepthStudy:
    """The depth study of the deltas of every fine-tune of ``base`` in the store (``over_finetunes``).

    ``base`` is a local path or a Hub id as stored; Hub models are fetched at their stored
    revisions. A fine-tune that cannot be fetched or read is in ``study.failed``; the others go on.
    """
    with opened(store, read_only=True) as db:
        meta = db.metadata()
        local = Path(base).exists()
        base_id = model_id(base) if local else base
        if base_id not in set(meta["base"]) and not local:
            base_id = resolve_base(base).canonical
        rows = {m: src for m, b, src in zip(meta["model"], meta["base"], meta["source"]) if b == base_id}
        if not rows:
            raise NothingStoredError(str(base), "no stored fine-tunes of this base; embed some first")
        base_path = local_files(base_id, "", db)
        models, unreadable = [], {}
        for m in sorted(rows):
            try:
                models.append(local_files(m, rows[m], db))
            except ModelvecError as exc:  # e.g. gone from the Hub and from the cache: the others go on
                unreadable[m] = str(exc)
    if not models:  # say why, not "none of 0"
        reason = next(iter(unreadable.values()))
        raise FetchError(str(base), f"none of its {len(rows)} stored fine-tunes could be fetched; the first: {reason}")
    study, failed = over_finetunes(
        base_path, models, thresholds=thresholds, device=device, name=None if base_path == base_id else base_id
    )
    study.failed = {**unreadable, **failed}
    return study
