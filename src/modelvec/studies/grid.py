"""The representations a comparison embeds (:func:`~modelvec.studies.compare.evaluate`): the study's grid.

The SVD factors and the sketches, at every rank of a :class:`~modelvec.studies.sweep.Sweep`, with and without
block normalisation, each named by its parameters; :data:`VARIANTS` is the default comparison. Only the
representation's settings: nothing here reads a model or imports torch.
"""

from __future__ import annotations

import itertools

from ..represent.representation import POOLINGS, Representation
from .sweep import Sweep

#: The study's SVD factors: as the original study ran them (U, raw signs), with canonical signs, scaled by Σ,
#: and the singular values alone, pooled by mean, and U·Σ concatenated over layers.
SVD_GRID: tuple[dict[str, str], ...] = (
    dict(factor="U", sign="none"),
    dict(factor="U"),
    dict(factor="US", sign="none"),
    dict(factor="US"),
    dict(factor="US", pooling="concat"),
    dict(factor="S"),
)


def variants(
    sweep: Sweep | None = None, vocabulary_head: bool = False, *, svd: bool = True, default: bool = True
) -> dict[str, Representation]:
    """The representations compared, named by their parameters (:meth:`Representation.label`).

    The study's design, at every rank of ``sweep``: with ``svd``, the SVD factors (:data:`SVD_GRID`), with and
    without block normalisation; the sketch with each projection of ``sweep``, reading each share of its rows,
    pooled by mean and concatenated, block-normalised (and without block normalisation for the shared projection
    of whole matrices, as first compared); all of the deltas alone (no head). ``vocabulary_head``: also the
    block-normalised sketches (mean and concat) of the first projection and share with the head's vocabulary
    prior appended. ``default``: also the default representation (:class:`Representation`'s defaults), marked.
    ``sweep``'s seeds are :func:`evaluate`'s, not a variant's.
    """
    sweep = sweep or Sweep()
    out: dict[str, Representation] = {}
    for block_norm in (False, True):
        for rank in sweep["rank"]:
            grid = [
                Representation(rank=rank, block_norm=block_norm, head="none", **fields)  # type: ignore[arg-type]
                for fields in (SVD_GRID if svd else ())
            ]
            for projection, (share, auto_rows) in itertools.product(sweep["projection"], _rows(sweep)):
                if block_norm or (projection, share) == ("shared", 1.0):
                    grid += [
                        Representation(
                            rank=rank,
                            projection=projection,
                            rows=share,
                            auto_rows=auto_rows,
                            pooling=pooling,
                            block_norm=block_norm,
                            head="none",
                            probe=probe,
                        )
                        for pooling in POOLINGS
                        for probe in _probes(sweep, projection, block_norm)
                    ]
            out.update((r.label(), r) for r in grid)
    if vocabulary_head:
        projection, share, auto_rows = sweep["projection"][0], sweep["rows"][0], sweep["auto_rows"][0]
        for rank in sweep["rank"]:
            for pooling, probe in itertools.product(POOLINGS, _probes(sweep, projection, True)):
                r = Representation(
                    rank=rank,
                    projection=projection,
                    rows=share,
                    auto_rows=auto_rows,
                    pooling=pooling,
                    head="vocabulary",
                    probe=probe,
                )
                out[r.label()] = r
    if default:  # marked in its name; where the grid has it already, that row is renamed
        chosen = Representation()
        out = {f"{name} (default)" if r == chosen else name: r for name, r in out.items()}
        if chosen not in out.values():
            out[f"{chosen.label()} (default)"] = chosen
    return out


def _probes(sweep: Sweep, projection: str, block_norm: bool) -> tuple[int | str, ...]:
    """The probes compared for a projection: the sweep's for the block-normed CountSketch (the probe's), else none."""
    return sweep["probe"] if projection == "countsketch" and block_norm else ("none",)


def _rows(sweep: Sweep) -> list[tuple[float | str, int | str]]:
    """The rows each variant reads: every share of the sweep, and ``auto`` with each of its ``auto_rows``."""
    default = Representation().auto_rows
    return [(share, n) for share in sweep["rows"] for n in (sweep["auto_rows"] if share == "auto" else (default,))]


#: The default comparison, every field at its default (rank 32, CountSketch, auto rows): the SVD factors with and
#: without block normalisation (12), the block-normed CountSketch of auto rows, mean and concatenated (2), and the
#: default representation (15 distinct parameter sets).
VARIANTS: dict[str, Representation] = variants()
