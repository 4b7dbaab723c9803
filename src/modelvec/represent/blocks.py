"""Where each matrix sits in a vector, and which stored rows a vector reads: from a checkpoint's layout and shapes
alone, with no tensor read and no tensor library imported (``cluster`` and ``neighbors`` draw the blocks of stored
vectors without loading torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..read import Checkpoint, Layout, open_checkpoint
from .plans import MatrixPlan, plan_matrix, within_size
from .representation import Representation


@dataclass(frozen=True, kw_only=True)
class Block:
    """Where one matrix's factor sits in the vector: [start, stop). ``layer`` is None when pooled."""

    stack: str
    layer: int | None
    family: str
    n: int
    start: int
    stop: int


def vector_blocks(
    layout: Layout, plans: dict[tuple[str, int, str], MatrixPlan], representation: Representation, vocab: int = 0
) -> list[Block]:
    """Where each stack, layer (None when pooled) and family sits in a vector of ``representation``.

    A matrix's block has ``representation.plan_floats(plan)`` floats (rank x kept, ``kept`` the side its factor
    keeps, or less under a size budget: :func:`~modelvec.represent.plans.within_size`). With the head
    (:func:`has_head`), the last block is the head's (stack ``"head"``, family ``"vocabulary"``, ``vocab`` floats,
    the head's as budgeted; 0: no head)."""
    blocks: list[Block] = []
    pos = 0
    for stack, layer, refs in layout.by_layer():
        if representation.pooling == "mean" and layer > 0:
            continue
        for ref in refs:
            n = plans[ref.key].kept
            size = representation.plan_floats(plans[ref.key])
            blocks.append(
                Block(
                    stack=stack,
                    layer=layer if representation.pooling == "concat" else None,
                    family=ref.family,
                    n=n,
                    start=pos,
                    stop=pos + size,
                )
            )
            pos += size
    if vocab:
        blocks.append(Block(stack="head", layer=None, family="vocabulary", n=vocab, start=pos, stop=pos + vocab))
    return blocks


def has_head(base: Checkpoint, layout: Layout, representation: Representation) -> bool:
    """Whether vectors of ``representation`` over ``base`` end in the head's block: ``head="vocabulary"``, or
    ``"auto"`` where the family's head is on by default and the base has the embeddings it is read through."""
    if representation.head == "vocabulary":
        return True  # a family without one is refused where the head is read, naming the family
    head = layout.arch.vocabulary_head
    return representation.uses_head(head) and head is not None and base.find(head.embedding) is not None


def plans_of(ck: Checkpoint, layout: Layout, representation: Representation) -> dict[tuple[str, int, str], MatrixPlan]:
    """Each matrix's :class:`~modelvec.represent.plans.MatrixPlan` in ``ck``, from its stored shapes alone.

    The share of rows is ``representation.share`` of the values all these matrices hold (for ``rows="auto"``);
    the blocks' floats fit the vector's size budget (:func:`~modelvec.represent.plans.within_size`). A fused tensor
    whose parts do not divide it is refused here, naming it."""
    return _budgeted(ck, layout, representation)[0]


def head_floats(ck: Checkpoint, layout: Layout, representation: Representation) -> int:
    """The head's block's floats in vectors of ``representation`` over ``ck`` (0: no head): the vocabulary's size,
    or what the size budget left it."""
    return _budgeted(ck, layout, representation)[1]


def vocabulary_size(ck: Checkpoint, layout: Layout, representation: Representation) -> int:
    """The vocabulary the head's block is read over (0: vectors of ``representation`` over ``ck`` have no head),
    from the embeddings' shape alone."""
    if not has_head(ck, layout, representation):
        return 0
    head = layout.arch.vocabulary_head
    key = ck.find(head.embedding) if head is not None else None
    return int(ck.shape(key)[0]) if key is not None and ck.shape(key) else 0


def _budgeted(
    ck: Checkpoint, layout: Layout, representation: Representation
) -> tuple[dict[tuple[str, int, str], MatrixPlan], int]:
    """The plans and the head's floats, worked out once per checkpoint, layout and representation: the fetch's read
    plan, the fit's plans and its head all ask (the layout is held with them, so its id names it while they live)."""
    key = ("plans", id(layout), representation)
    if key not in ck.from_shapes:
        ck.from_shapes[key] = (layout, _budget(ck, layout, representation))
    return ck.from_shapes[key][1]


def _budget(
    ck: Checkpoint, layout: Layout, representation: Representation
) -> tuple[dict[tuple[str, int, str], MatrixPlan], int]:
    shapes = [ck.matrix_shape(ref, layout.prefix) for ref in layout.refs]  # checked: matrices, parts that divide
    share = representation.row_budget(sum(int(n) * int(m) for n, m in shapes))
    plans = {}
    for ref in layout.refs:
        stored = ck.shape(layout.prefix + ref.tensor)
        plans[ref.key] = plan_matrix(ref, (int(stored[0]), int(stored[1])), representation, layout.prefix, share)
    return within_size(plans, representation, vocabulary_size(ck, layout, representation))


def read_plan(ck: Checkpoint, representation: Representation, *, base: bool) -> dict[str, list[tuple[int, int]]]:
    """The stored rows of each tensor of ``ck`` that its vector under ``representation`` reads (tensor -> row ranges).

    Known from the shapes alone, before any weight is read: what a partial download fetches. With the
    vocabulary head, its bias whole, and for the ``base`` the embeddings it is read through."""
    layout = ck.layout()
    plan: dict[str, list[tuple[int, int]]] = {}
    for p in plans_of(ck, layout, representation).values():
        plan.setdefault(p.tensor, []).extend(p.row_ranges)
    head = layout.arch.vocabulary_head
    if representation.uses_head(head) and head is not None:
        for name in (*head.bias, head.embedding) if base else head.bias:
            key = ck.find(name)
            if key is not None:
                shape = ck.shape(key)
                plan[key] = [(0, int(shape[0]) if shape else 1)]
    return plan


def blocks_of(base: str | os.PathLike[str] | Checkpoint, representation: Representation) -> list[Block]:
    """The blocks of vectors of ``representation`` over ``base``, from its layout and shapes alone (no weights read)."""
    ck = base if isinstance(base, Checkpoint) else open_checkpoint(base)
    layout = ck.layout()
    plans, head = _budgeted(ck, layout, representation)
    return vector_blocks(layout, plans, representation, head)
