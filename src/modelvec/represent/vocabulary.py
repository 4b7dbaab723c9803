"""The vocabulary head's block of a vector: a model's head prior E (beta - beta_base), read through the base's
embeddings (:class:`VocabularyReadout`)."""

from __future__ import annotations

import torch

from ..core.errors import ArchitectureError, CheckpointError, IncompatibleError
from ..read import Checkpoint, Layout
from .plans import derived_seed


class VocabularyReadout:
    """The head's vocabulary prior of a model, E (beta - beta_base), read through the base's embeddings E.

    See :class:`~modelvec.read.roles.VocabularyHead` for what it is and
    :class:`~modelvec.represent.representation.Representation` (``head``) for how it enters the vector.
    """

    _ROWS = 8192  # rows of E converted to float64 at a time

    def __init__(self, base: Checkpoint, layout: Layout, floats: int | None = None, seed: int = 0) -> None:
        """``floats``: the block's size where the vector's size budget makes it smaller than the vocabulary (its
        prior then CountSketched into that many buckets, seeded by ``seed``; None: the vocabulary's)."""
        head = layout.arch.vocabulary_head
        if head is None:
            raise ArchitectureError(
                base.name,
                f"head='vocabulary' needs a family whose head ends in the vocabulary through a norm with a "
                f"bias (bert, roberta, distilbert, gpt2); {layout.arch.name} has none",
            )
        key = base.find(head.embedding)
        if key is None:
            raise CheckpointError(
                base.name, f"no embedding matrix {head.embedding} to read the vocabulary head through"
            )
        self.names = head.bias
        self.embedding = base.get_stored(key)  # (vocab, width), a view of the mapped file
        if self.embedding.ndim != 2:
            raise CheckpointError(base.name, f"tensor {key} has shape {list(self.embedding.shape)}, expected a matrix")
        self.vocab, self.width = (int(d) for d in self.embedding.shape)
        self.floats = self.vocab if floats is None else floats
        self.buckets: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.floats < self.vocab:  # a CountSketch of the prior: a bucket and a sign per token, fixed by the seed
            gen = torch.Generator().manual_seed(derived_seed(seed, "countsketch", "head"))
            self.buckets = (
                torch.randint(0, self.floats, (self.vocab,), generator=gen),
                (torch.randint(0, 2, (self.vocab,), generator=gen) * 2 - 1).double(),
            )
        base_bias = self.bias(base)
        self.base_bias = torch.zeros(self.width, dtype=torch.float64) if base_bias is None else base_bias

    def bias(self, ck: Checkpoint) -> torch.Tensor | None:
        """The head's beta in ``ck`` (float64), None when it has no such head (a classifier, an encoder alone)."""
        key = next((k for k in (ck.find(n) for n in self.names) if k is not None), None)
        if key is None:
            return None
        beta = ck.get(key).double()
        if tuple(beta.shape) != (self.width,):
            raise IncompatibleError(
                ck.name, f"tensor {key} has shape {list(beta.shape)}, the embeddings' width is {self.width}"
            )
        if not bool(torch.isfinite(beta).all()):
            raise CheckpointError(ck.name, f"tensor {key} has NaN or Inf values")
        return beta

    def block(self, ck: Checkpoint, scale: float) -> torch.Tensor:
        """The head's block of ``ck``'s vector: E (beta - beta_base) centred over the vocabulary, norm ``scale``."""
        return self.block_of(self.bias(ck), scale)

    def block_of(self, beta: torch.Tensor | None, scale: float) -> torch.Tensor:
        """The head's block of a model whose head's beta is ``beta`` (None: it has none), norm ``scale``."""
        if beta is None:
            return torch.zeros(self.floats)
        delta = beta - self.base_bias
        prior = torch.cat(
            [self.embedding[i : i + self._ROWS].double() @ delta for i in range(0, self.vocab, self._ROWS)]
        )
        prior -= prior.mean()
        norm = float(prior.norm())
        if norm == 0:
            return torch.zeros(self.floats)
        prior *= scale / norm
        if self.buckets is not None:  # linear and unbiased: inner products of sketched priors are exact on average
            where, sign = self.buckets
            prior = torch.zeros(self.floats, dtype=torch.float64).index_add_(0, where, prior * sign)
        return prior.float()
