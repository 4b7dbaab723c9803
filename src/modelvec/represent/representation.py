"""The representation: fine-tuning deltas turned into one vector, as ``vectors.md`` describes, and its parameters.

For every stack, layer and family: dW = W_ft - W_base in R^{n x m} (x @ W orientation), a rank-r truncated SVD
dW ~ U S V^T and the n x r factor kept (``factor``: U, U S, S), flattened singular vector after singular vector; per
layer the families concatenated in the architecture table's order, layers pooled (``pooling``: mean or concat), the
stacks (encoder, decoder) concatenated. Singular vectors are signed (``sign``); columns beyond min(n, m) or of a
numerically zero singular value are zeros.

Where the description is open, :class:`Representation` makes the choice explicit, each parameter a declared setting
with its help, values and bounds (:mod:`modelvec.core.settings`): ``factor="sketch"`` is a fixed, seeded
projection of dW shared by all models (``projection``: CountSketch by default, a Johnson-Lindenstrauss embedding of
each block), linear in dW so that every model's sketch lives in one space, with no SVD; ``rows`` reads a seeded
share (or, ``auto``, a number) of each matrix's stored rows, the same for every model and the base
(:mod:`modelvec.represent.plans`); ``block_norm`` scales each block to unit norm before pooling; ``head`` appends
the masked-LM head's vocabulary prior; ``probe`` takes each delta through the base's own inputs on a packaged text
(:mod:`modelvec.represent.probe`); ``solver`` is randomized block Krylov or exact LAPACK.

A PEFT LoRA adapter's vector is computed from its thin factors, dW = L R^T (:mod:`modelvec.read.adapters`), and
equals the merged model's. Why each default is what it is, measured: docs/representation.md and docs/evidence.md
(``modelvec evaluate`` chose the defaults on the evidence zoo's selection half).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..core.settings import key_of, setting, until_added, validate
from ..read import VocabularyHead

FACTORS = ("U", "US", "S", "sketch")
PROJECTIONS = ("shared", "gaussian", "countsketch")
POOLINGS = ("mean", "concat")
SOLVERS = ("randomized", "exact")
SIGNS = ("max-abs", "none")
HEADS = ("auto", "none", "vocabulary")
#: ``rows="auto"``: where the vector's matrices hold at least ``AUTO_FROM`` values, ``AUTO_ROWS`` rows of each matrix
#: (``auto_rows``; ``"share"``: ``AUTO_SHARE`` of them); every row below.
AUTO_SHARE = 0.05
AUTO_FROM = 50_000_000
AUTO_ROWS = 64


def _sketch(r: Any) -> bool:
    return r.factor == "sketch"


def _svd(r: Any) -> bool:
    return r.factor != "sketch"


def _countsketch(r: Any) -> bool:
    """The CountSketch of each block: what the size budget, the probe and ``delta_rank`` apply to."""
    return r.factor == "sketch" and r.projection == "countsketch"


def _randomized(r: Any) -> bool:
    return r.factor != "sketch" and r.solver == "randomized"


class PlannedBlock(Protocol):
    """What a matrix's read plan says of its block (:class:`~modelvec.represent.plans.MatrixPlan`): the plans are
    made from a representation, so the representation knows only this of them, never how they are made."""

    @property
    def kept(self) -> int: ...

    @property
    def floats(self) -> int | None: ...


@dataclass(frozen=True, kw_only=True)
class Representation:
    """The parameters of a representation, each declared once with its help, allowed values and place in the
    key (the CLI's options are made from them), validated once; ``key()`` names it in the store."""

    rank: int = setting(
        32, "Width r of each matrix's sketch (or rank of its truncated SVD).", minimum=1, key="r{}", order=1
    )
    factor: str = setting(
        "sketch",
        "What is kept of each delta: the sketch (a random projection), or from its SVD U, U·Σ (US) or the "
        "singular values alone (S).",
        choices=FACTORS,
        key="{}",
        order=2,
    )
    projection: str = setting(
        "countsketch",
        "The sketch's projection: one Gaussian per width for all layers (shared), an independent Gaussian per "
        "layer and matrix (gaussian), or a CountSketch of each block (countsketch).",
        choices=PROJECTIONS,
        key="{}",
        order=9,
        tags=(("gaussian", "gauss"), ("countsketch", "cs")),
        omit=("shared",),
        until_added=("shared",),
        applies=_sketch,
    )
    rows: float | str = setting(
        "auto",
        "Share of each matrix's rows (as stored) that is read, in contiguous blocks chosen from the seed: a Hub "
        "model costs only those bytes (the SVD factors read whole matrices). "
        f"auto: where the matrices hold {AUTO_FROM / 1e6:g}M values or more (bert-base and up), the rows "
        "--auto-rows says; every row of smaller models.",
        above=0,
        maximum=1,
        words=("auto",),
        kind=float,
        metavar="SHARE",
        key="rows{:g}",
        tags=(("auto", "rowsauto"),),
        order=10,
        omit=(1.0,),
        until_added=(1.0,),
        applies=_sketch,
    )
    auto_rows: int | str = setting(
        AUTO_ROWS,
        "With rows auto, the rows read of each matrix of a checkpoint whose matrices hold "
        f"{AUTO_FROM / 1e6:g}M values or more: a number ({AUTO_ROWS}: about 1 % of an 8B model's bytes), or share: "
        f"{AUTO_SHARE:.0%} of them.",
        minimum=1,
        words=("share",),
        kind=int,
        metavar="N",
        key="n{}",
        order=11,
        omit=("share",),
        until_added=("share",),
        applies=lambda r: _sketch(r) and r.rows == "auto",
    )
    pooling: str = setting("mean", "How layers are pooled.", choices=POOLINGS, key="{}", order=3)
    solver: str = setting("randomized", "SVD solver (U, US, S).", choices=SOLVERS, key="{}", order=4, applies=_svd)
    sign: str = setting(
        "max-abs",
        "Sign canonicalisation of singular vectors (U, US).",
        choices=SIGNS,
        key="{}",
        order=5,
        applies=lambda r: r.factor in ("U", "US"),
    )
    n_iter: int = setting(
        4, "Block Krylov iterations of the randomized solver.", minimum=0, key="it{}", order=6, applies=_randomized
    )
    n_oversamples: int = setting(
        8,
        "Extra columns of the randomized solver.",
        minimum=0,
        flag="--oversamples",
        key="os{}",
        order=7,
        applies=_randomized,
    )
    seed: int = setting(
        0,
        "Seed of the sketch, the rows read and the randomized solver.",
        minimum=0,
        key="seed{}",
        order=8,
        applies=lambda r: _sketch(r) or _randomized(r),
    )
    size: int | str = setting(
        100_000,
        "At most this many floats per vector (the CountSketch's): every block, the head's too, shrunk by the same "
        "share where the vector would be longer, so a store of 10,000 models of any base holds at most 4 GB (an 8B "
        "base's vector is 1.2M floats unbounded); none: rank x width per block, as before.",
        minimum=64,
        words=("none",),
        kind=int,
        metavar="FLOATS",
        key="d{}",
        order=14,
        omit=("none",),
        until_added=("none",),
        applies=_countsketch,
    )
    block_norm: bool = setting(
        True, "Scale each layer-and-family block to unit norm before pooling.", key="bn", order=12
    )
    head: str = setting(
        "auto",
        "Heads: vocabulary appends the head's vocabulary prior, which tells language-modelling fine-tunes apart "
        "by their texts (bert, roberta, distilbert, gpt2); none leaves heads out, as described; auto: vocabulary "
        "where the family's head is a masked-LM head (bert, roberta, distilbert), none elsewhere.",
        choices=HEADS,
        key="head-{}",
        order=13,
        omit=("none",),
        until_added=("none",),
    )
    probe: int | str = setting(
        "auto",
        "Take each matrix's delta through the base's own inputs to it on the first TOKENS tokens of a packaged, "
        "generic probe text (dW·H: how the fine-tune changes each layer's output on inputs the base sees) before "
        "the CountSketch; none: the delta itself; auto: the family's choice (its architecture entry). The base "
        "runs once through transformers (kept beside the store); the rows read do not change.",
        minimum=8,
        maximum=512,
        words=("none", "auto"),
        kind=int,
        metavar="TOKENS",
        key="probe{}",
        tags=(("auto", "probe-auto"),),
        order=15,
        omit=("none",),
        until_added=("none",),
        applies=_countsketch,
    )

    delta_rank: int | str = setting(
        "none",
        "Keep each matrix's delta at its top R singular directions (what an adapter of rank R can express; a "
        "full fine-tune's drift in the others dropped) before the CountSketch: of its change on the probe's "
        "inputs where the probe is taken, else on a seeded Gaussian of --rank columns. none: the whole delta.",
        minimum=1,
        maximum=512,
        words=("none",),
        kind=int,
        metavar="R",
        key="top{}",
        order=16,
        omit=("none",),
        until_added=("none",),
        applies=_countsketch,
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.rows != 1.0 and self.uses_svd:  # the SVD factors need whole matrices: the share is the sketch's
            object.__setattr__(self, "rows", 1.0)

    @property
    def reads_share(self) -> bool:
        """Whether the vector may read less than every row (a share, or ``auto``: known from the shapes)."""
        return self.rows != 1.0

    def uses_head(self, head: VocabularyHead | None) -> bool:
        """Whether vectors over a family whose vocabulary head is ``head`` (None: it has none) append its block."""
        return self.head == "vocabulary" or (self.head == "auto" and head is not None and head.default)

    def row_budget(self, values: int) -> float | int:
        """What is read of each matrix of a checkpoint whose matrices (the vector's) hold ``values`` values: a share
        of its rows (a float: ``rows``; for ``auto``, 1 below :data:`AUTO_FROM` values) or a number of them (an int:
        ``auto_rows`` from :data:`AUTO_FROM` up; its ``"share"``, :data:`AUTO_SHARE`). The same for a base and all its
        fine-tunes, whose matrices have the same shapes. A number, not a share: a sketch's error follows how many
        rows it reads, not what share of the matrix they are (docs/scale.md)."""
        if isinstance(self.rows, float):
            return self.rows
        if values < AUTO_FROM:
            return 1.0
        return AUTO_SHARE if self.auto_rows == "share" else int(self.auto_rows)

    @property
    def size_limit(self) -> int | None:
        """The most floats a vector holds (None: no limit, or a representation the size does not apply to)."""
        return self.size if isinstance(self.size, int) and _countsketch(self) else None

    def plan_floats(self, plan: PlannedBlock) -> int:
        """Floats of one matrix's block: rank x kept, or what the size budget left it (:func:`within_size`)."""
        return plan.floats if plan.floats is not None else self.block_size(plan.kept)

    def probe_tokens(self, family_probe: int | None = None) -> int | None:
        """The probe's tokens where deltas are taken through the base's inputs (None: the deltas themselves);
        ``family_probe``: the base's family's choice (:attr:`~modelvec.read.roles.Architecture.probe`), what
        ``auto`` takes."""
        if not _countsketch(self):
            return None
        if self.probe == "auto":
            return family_probe
        return self.probe if isinstance(self.probe, int) else None

    @property
    def truncates(self) -> bool:
        """Whether each delta is kept at its top :attr:`delta_rank` directions (:class:`~.projection.TopProjection`)."""
        return isinstance(self.delta_rank, int) and _countsketch(self)

    @property
    def uses_svd(self) -> bool:
        return self.factor != "sketch"

    def block_size(self, n: int) -> int:
        """Floats one matrix contributes to a layer's vector, ``n`` its side that is not contracted."""
        return self.rank if self.factor == "S" else n * self.rank

    def key(self) -> str:
        """A stable, readable id: equal keys mean bit-identical vectors for the same inputs.

        Made from the fields' declarations (:func:`~modelvec.core.settings.key_of`): settings a representation
        does not use are left out (the SVD's solver for a sketch, the projection for an SVD factor), and so are
        settings added later at the value that reproduces what was computed before they existed
        (``projection="shared"``, ``rows=1``): a key once stored keeps naming the same vectors.
        """
        return key_of(self)

    def label(self) -> str:
        """A readable name for tables, made from the parameters that tell the compared representations apart:
        the factor, then what differs from the plain method (projection, rows, sign, exact solver, pooling, rank,
        size budget, block norm, head). It leaves out the seed and the randomized solver's iterations and
        oversamples, so representations that differ only in those share a label; :meth:`key` names them apart."""
        name = {"U": "U", "US": "U·Σ", "S": "singular values", "sketch": "sketch ΔW·Ω"}[self.factor]
        if self.factor == "sketch" and self.projection != "shared":
            name = {"gaussian": "sketch ΔW·Ω, Ω per block", "countsketch": "CountSketch"}[self.projection]
        parts = [name]
        if not self.uses_svd and self.rows == "auto":
            parts.append("auto rows" if self.auto_rows == "share" else f"auto rows ({self.auto_rows} a matrix)")
        elif not self.uses_svd and isinstance(self.rows, float) and self.rows < 1:
            parts.append(
                f"{self.rows:.0%} of rows" if self.rows * 100 == round(self.rows * 100) else f"rows {self.rows:g}"
            )
        if self.factor in ("U", "US"):
            parts.append("sign-canonical" if self.sign == "max-abs" else "raw signs")
        if self.uses_svd and self.solver == "exact":
            parts.append("exact SVD")
        if self.pooling == "concat":
            parts.append("concat")
        if self.rank != Representation.rank:
            parts.append(f"r{self.rank}")
        if self.size_limit is not None:
            parts.append(f"at most {self.size_limit:,} floats")
        if self.probe_tokens() is not None:
            parts.append(f"through the probe ({self.probe_tokens()} tokens)")
        elif self.probe == "auto" and self.probe_tokens(0) is not None:
            parts.append("auto probe")  # the family's choice (Architecture.probe): 32 tokens for Llama, else none
        if self.truncates:
            parts.append(f"top {self.delta_rank} directions")
        text = ", ".join(parts)
        text = text + " + block-norm" if self.block_norm else text
        return text + {"none": "", "vocabulary": " + vocabulary head", "auto": " + auto head"}[self.head]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_stored(cls, fields: dict[str, object]) -> Representation:
        """The representation a store recorded (:meth:`as_dict`). A setting it lacks was added later: it takes
        the value that reproduces what was computed before it existed (:data:`UNTIL_ADDED`), not today's default."""
        return cls(**{**UNTIL_ADDED, **fields})  # type: ignore[arg-type]


#: Settings added after vectors were first stored, at the value that computes what was computed before them (each
#: such field's ``until_added``, a value its ``omit`` leaves out of the key).
UNTIL_ADDED: dict[str, object] = until_added(Representation)

#: The fields of every representation the store recorded before ``projection`` existed (its first ``as_dict``).
_FIRST_FIELDS: dict[str, object] = dict(
    factor="sketch", pooling="mean", solver="randomized", sign="max-abs", n_iter=4, n_oversamples=8, seed=0
)

#: Every default key the project has had, oldest first, with the representation that computes it as the store
#: recorded it then (its ``as_dict`` of that day: the fields added since are absent, :meth:`Representation.from_stored`
#: fills them in). A key once stored names the same vectors for ever: ``tests/core/test_settings.py`` checks that each
#: still reads back to its key, so editing a declaration that would rename stored vectors fails there. A new default
#: is a new line at the end.
KEY_HISTORY: tuple[tuple[str, dict[str, object]], ...] = (
    ("r8-sketch-mean-seed0-bn", {**_FIRST_FIELDS, "rank": 8, "block_norm": True}),
    (
        "r32-sketch-mean-seed0-cs-rows0.05-bn",
        {**_FIRST_FIELDS, "rank": 32, "block_norm": True, "projection": "countsketch", "rows": 0.05},
    ),
    (
        "r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto",
        _AUTO_HEAD := {
            **_FIRST_FIELDS,
            "rank": 32,
            "block_norm": True,
            "projection": "countsketch",
            "rows": "auto",
            "head": "auto",
        },
    ),
    ("r32-sketch-mean-seed0-cs-rowsauto-bn-head-auto-d100000", _SIZED := {**_AUTO_HEAD, "size": 100_000}),
    ("r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000", _ROWS_64 := {**_SIZED, "auto_rows": 64}),
    ("r32-sketch-mean-seed0-cs-rowsauto-n64-bn-head-auto-d100000-probe-auto", {**_ROWS_64, "probe": "auto"}),
)
