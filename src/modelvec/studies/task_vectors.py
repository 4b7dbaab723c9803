"""The exact references a comparison scores beside its variants: the task vectors' inner products.

The cosine between whole flattened deltas over the representation's matrices, and the same with every matrix's
delta unit-normed, computed streaming, one matrix of all models at a time, never holding all deltas in memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..analyse.evaluation import TaskVectors
from ..read import open_checkpoint

if TYPE_CHECKING:
    from ..read import Checkpoint, MatrixRef

PathLike = str | os.PathLike[str]


def task_deltas(
    base_ck: Checkpoint, cks: Sequence[Checkpoint]
) -> Iterator[tuple[MatrixRef, torch.Tensor, dict[int, torch.Tensor]]]:
    """Per matrix of the base, one at a time: the base's matrix and each model's delta, float64.

    A full fine-tune's delta is W_ft - W_base; a LoRA adapter's is its factors' product, and a
    matrix the adapter leaves alone has no entry.
    """
    base_layout = base_ck.layout()
    layouts = [None if ck.factored else ck.layout() for ck in cks]
    shapes = {ref.key: tuple(base_ck.matrix(ref, base_layout.prefix, stored=True).shape) for ref in base_layout.refs}
    factored = {i: ck.low_rank_deltas(base_layout, shapes) for i, ck in enumerate(cks) if ck.factored}
    for ref in base_layout.refs:
        w0 = base_ck.matrix(ref, base_layout.prefix).double()
        deltas = {}
        for i, (ck, lay) in enumerate(zip(cks, layouts)):
            if lay is not None:
                deltas[i] = ck.matrix(ref, lay.prefix).double() - w0
            elif ref.key in factored[i]:
                low = factored[i][ref.key]
                deltas[i] = low.left.double() @ low.right.double().T
        yield ref, w0, deltas


def task_vector_gram(base: PathLike, models: Sequence[PathLike]) -> TaskVectors:
    """G[i, j] = <dW_i, dW_j> over all representation matrices, one matrix of all models at a time, and the same
    with every matrix's delta unit-normed (``gram_bn``; a zero delta stays zero).

    A LoRA adapter's delta is its factors' product (zero for the matrices it leaves alone), formed
    one matrix at a time like a full fine-tune's (:func:`task_deltas`).
    """
    start = time.perf_counter()
    cks = [open_checkpoint(m) for m in models]
    gram = np.zeros((len(cks), len(cks)))
    gram_bn = np.zeros((len(cks), len(cks)))
    dim = 0
    for _, w0, deltas in task_deltas(open_checkpoint(base), cks):
        rows = [deltas[i].reshape(-1) if i in deltas else w0.new_zeros(w0.numel()) for i in range(len(cks))]
        stacked = torch.stack(rows)
        block = (stacked @ stacked.T).numpy()
        gram += block
        norms = np.sqrt(np.clip(np.diag(block), 0, None))
        unit = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        gram_bn += block * unit[:, None] * unit[None, :]
        dim += w0.numel()
    seconds = (time.perf_counter() - start) / max(len(cks), 1)
    return TaskVectors(gram, dim, seconds, np.array([ck.factored for ck in cks], dtype=bool), gram_bn)
