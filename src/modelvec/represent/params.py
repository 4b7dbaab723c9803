"""The representation: fine-tuning deltas turned into one vector, as ``vectors.md`` describes.

For every stack, layer and family: dW = W_ft - W_base in R^{n x m} (x @ W orientation), a rank-r
truncated SVD dW ~ U S V^T, and the n x r factor kept (U, or U S), flattened column by column
(singular vector after singular vector). Per layer the families are concatenated in the
architecture table's order; layers are pooled (``mean`` as described, or ``concat``); the stacks
(encoder, decoder) are concatenated.

Where the description is open, :class:`Representation` makes the choice explicit:

- ``factor``: ``"U"`` (as the original study), ``"US"`` (U scaled by the singular values),
  ``"S"`` (the singular values alone), or ``"sketch"``: dW @ Omega with one fixed, seeded
  Gaussian Omega (m x r) per matrix shape shared by all models; linear in dW, so sketches of
  different models live in one space, with no SVD. The default, ``sketch`` with ``block_norm``
  at rank 8, was chosen by ``modelvec evaluate`` on the demo zoo and checked on the evidence zoo's
  report half (docs/evidence.md): there the sketch matches the exact task vectors from rank 16
  on, and the SVD factors stay near chance. Rank 8 is kept for its cost on 1-8B models; use 16,
  or ``pooling="concat"``, for small ones.
- ``block_norm``: each layer-and-family block scaled to unit norm before pooling, so the large
  feed-forward blocks do not drown the attention blocks.
- ``pooling``: ``"mean"`` over layers (as described) or ``"concat"``.
- ``solver``: ``"randomized"`` (randomized block Krylov with a fixed seed: deterministic, within
  ~1e-3 of the exact vector on real fine-tunes at the default 4 iterations, ~25x faster on
  bert-base) or ``"exact"`` (full LAPACK SVD; slow, the reference).
- ``head``: ``"vocabulary"`` appends one block over the vocabulary, the head's vocabulary prior
  E (beta_ft - beta_base): what the norm before a tied vocabulary projection (BERT's masked-LM
  head, GPT-2's ``ln_f``) adds to every token's logit whatever the input, read through the
  base's embeddings E (:class:`~modelvec.read.architectures.VocabularyHead`; beta_base is 0 when
  the base has no such head, as HF initialises it). Centred over the vocabulary (logits are
  shift-invariant) and scaled to the norm of the rest of the vector, so it weighs as much as all
  the deltas together; zeros for a model without that head (a classifier). A language-modelling
  fine-tune's texts are there, not in its encoder's deltas (docs/evidence.md, "Where the texts
  are"). ``"none"`` (the default) leaves heads out, as the description does.
- ``sign``: singular vectors are defined only up to sign, so U from two models is not comparable
  column by column and a mean over layers would mix arbitrary signs. ``"max-abs"`` flips each
  singular vector so that its largest-magnitude entry is positive (ties: the first such entry);
  ``"none"`` keeps what the solver returned.

A PEFT LoRA adapter is a fine-tune whose delta comes factored, dW = L R^T (:mod:`modelvec.read.adapters`):
its vector is computed from the thin factors and equals the merged model's, whatever the factor.

Columns beyond min(n, m), and those whose singular value is numerically zero (below
max(n, m) * eps * sigma_1, e.g. an untouched layer), are zeros: a zero delta has no directions,
and arbitrary ones would only add noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FACTORS = ("U", "US", "S", "sketch")
POOLINGS = ("mean", "concat")
SOLVERS = ("randomized", "exact")
SIGNS = ("max-abs", "none")
HEADS = ("none", "vocabulary")


@dataclass(frozen=True)
class Representation:
    """The parameters of a representation, validated once; ``key()`` names it in the store."""

    rank: int = 8
    factor: str = "sketch"  # chosen by `modelvec evaluate` on the demo zoo (README)
    pooling: str = "mean"
    solver: str = "randomized"
    sign: str = "max-abs"
    n_iter: int = 4
    n_oversamples: int = 8
    seed: int = 0
    block_norm: bool = True
    head: str = "none"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("factor", FACTORS),
            ("pooling", POOLINGS),
            ("solver", SOLVERS),
            ("sign", SIGNS),
            ("head", HEADS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        for name in ("rank", "n_iter", "n_oversamples", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "rank" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'rank' else 0}, not {value!r}")
        if not isinstance(self.block_norm, bool):
            raise ValueError(f"block_norm must be a bool, not {self.block_norm!r}")

    @property
    def uses_svd(self) -> bool:
        return self.factor != "sketch"

    def block_size(self, n: int) -> int:
        """Floats one n x m matrix contributes to a layer's vector."""
        return self.rank if self.factor == "S" else n * self.rank

    def key(self) -> str:
        """A stable, readable id: equal keys mean bit-identical vectors for the same inputs."""
        parts = [f"r{self.rank}", self.factor, self.pooling]
        if not self.uses_svd:
            parts.append(f"seed{self.seed}")
        else:
            parts.append(self.solver)
            if self.factor != "S":
                parts.append(self.sign)
            if self.solver == "randomized":
                parts += [f"it{self.n_iter}", f"os{self.n_oversamples}", f"seed{self.seed}"]
        if self.block_norm:
            parts.append("bn")
        if self.head != "none":
            parts.append(f"head-{self.head}")
        return "-".join(parts)

    def label(self) -> str:
        """A readable name for tables, made from the parameters (so distinct parameters, distinct names):
        the factor, then what differs from the plain method (sign, pooling, block norm, rank, solver)."""
        name = {"U": "U", "US": "U·Σ", "S": "singular values", "sketch": "sketch ΔW·Ω"}[self.factor]
        parts = [name]
        if self.factor in ("U", "US"):
            parts.append("sign-canonical" if self.sign == "max-abs" else "raw signs")
        if self.uses_svd and self.solver == "exact":
            parts.append("exact SVD")
        if self.pooling == "concat":
            parts.append("concat")
        if self.rank != Representation.rank:
            parts.append(f"r{self.rank}")
        text = ", ".join(parts)
        text = text + " + block-norm" if self.block_norm else text
        return text + " + vocabulary head" if self.head == "vocabulary" else text

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
