"""Tiny random models of every family, built with ``transformers``, and the vector each fine-tune should give,
written here from the definition, never from modelvec's tables:

- each spec says how to build the model and, independently of modelvec's tables, which module plays which role;
- the reference vector walks the *modules* of the ``transformers`` model (``nn.Linear`` weights
  transposed, GPT-2 ``Conv1D`` used as is, ``c_attn`` split in three), takes dW = W_ft - W_base,
  a float64 ``torch.linalg.svd``, max-abs signs, zeroed null columns, zero padding, column-wise
  flattening, family order, layer pooling and stack concatenation;
- fine-tunes carry planted low-rank deltas (orthonormal A, B and well-separated singular values),
  so singular vectors are well defined and the planted column space is known.

Shared by the architecture tables' tests (tests/read/test_architectures.py) and the solver's
(tests/represent/test_solver.py); conftest's session-wide ``zoo`` fixture is a :class:`Zoo`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402

from modelvec import DeltaEmbedder  # noqa: E402

transformers.logging.set_verbosity_error()

EPS32 = float(np.finfo(np.float32).eps)

# --- tiny model families ---------------------------------------------------------------------------
# Each spec says how to build the model and, independently of modelvec's tables, which module plays
# which role: items are (family, module, n_parts, part) in the order the description lists them.

Item = tuple[str, torch.nn.Module, int, int]
LayerItems = tuple[str, int, list[Item]]


def _bert_like(encoder) -> list[LayerItems]:
    out = []
    for i, layer in enumerate(encoder.layer):
        att = layer.attention
        out.append(
            (
                "encoder",
                i,
                [
                    ("q", att.self.query, 1, 0),
                    ("k", att.self.key, 1, 0),
                    ("v", att.self.value, 1, 0),
                    ("o", att.output.dense, 1, 0),
                    ("ff1", layer.intermediate.dense, 1, 0),
                    ("ff2", layer.output.dense, 1, 0),
                ],
            )
        )
    return out


def _distilbert(core) -> list[LayerItems]:
    out = []
    for i, layer in enumerate(core.transformer.layer):
        att = layer.attention
        out.append(
            (
                "encoder",
                i,
                [
                    ("q", att.q_lin, 1, 0),
                    ("k", att.k_lin, 1, 0),
                    ("v", att.v_lin, 1, 0),
                    ("o", att.out_lin, 1, 0),
                    ("ff1", layer.ffn.lin1, 1, 0),
                    ("ff2", layer.ffn.lin2, 1, 0),
                ],
            )
        )
    return out


def _t5_ff(dense) -> list[Item]:
    if hasattr(dense, "wi_0"):  # gated (v1.1 / Flan): act(wi_0 x) * (wi_1 x)
        return [("ff_gate", dense.wi_0, 1, 0), ("ff1", dense.wi_1, 1, 0), ("ff2", dense.wo, 1, 0)]
    return [("ff1", dense.wi, 1, 0), ("ff2", dense.wo, 1, 0)]


def _t5(core) -> list[LayerItems]:
    out = []
    for i, block in enumerate(core.encoder.block):
        sa = block.layer[0].SelfAttention
        items = [("q", sa.q, 1, 0), ("k", sa.k, 1, 0), ("v", sa.v, 1, 0), ("o", sa.o, 1, 0)]
        out.append(("encoder", i, items + _t5_ff(block.layer[1].DenseReluDense)))
    for i, block in enumerate(core.decoder.block):
        sa, ca = block.layer[0].SelfAttention, block.layer[1].EncDecAttention
        items = [("q", sa.q, 1, 0), ("k", sa.k, 1, 0), ("v", sa.v, 1, 0), ("o", sa.o, 1, 0)]
        items += [("cross_q", ca.q, 1, 0), ("cross_k", ca.k, 1, 0), ("cross_v", ca.v, 1, 0), ("cross_o", ca.o, 1, 0)]
        out.append(("decoder", i, items + _t5_ff(block.layer[2].DenseReluDense)))
    return out


def _gpt2(core) -> list[LayerItems]:
    out = []
    for i, block in enumerate(core.h):
        out.append(
            (
                "decoder",
                i,
                [
                    ("q", block.attn.c_attn, 3, 0),
                    ("k", block.attn.c_attn, 3, 1),
                    ("v", block.attn.c_attn, 3, 2),
                    ("o", block.attn.c_proj, 1, 0),
                    ("ff1", block.mlp.c_fc, 1, 0),
                    ("ff2", block.mlp.c_proj, 1, 0),
                ],
            )
        )
    return out


def _phi3(core) -> list[LayerItems]:
    """Phi-3's fused tensors, split as transformers' Phi3Attention and Phi3MLP split them."""
    out = []
    for i, layer in enumerate(core.layers):
        att, mlp = layer.self_attn, layer.mlp
        q = att.config.num_attention_heads * att.head_dim
        kv = att.num_key_value_heads * att.head_dim
        qkv, gate_up = (q, kv, kv), (mlp.gate_up_proj.weight.shape[0] // 2,) * 2  # rows of q | k | v, gate | up
        out.append(
            (
                "decoder",
                i,
                [
                    ("q", att.qkv_proj, qkv, 0),
                    ("k", att.qkv_proj, qkv, 1),
                    ("v", att.qkv_proj, qkv, 2),
                    ("o", att.o_proj, 1, 0),
                    ("ff_gate", mlp.gate_up_proj, gate_up, 0),
                    ("ff1", mlp.gate_up_proj, gate_up, 1),
                    ("ff2", mlp.down_proj, 1, 0),
                ],
            )
        )
    return out


def _llama(core) -> list[LayerItems]:
    out = []
    for i, layer in enumerate(core.layers):
        att, mlp = layer.self_attn, layer.mlp
        out.append(
            (
                "decoder",
                i,
                [
                    ("q", att.q_proj, 1, 0),
                    ("k", att.k_proj, 1, 0),
                    ("v", att.v_proj, 1, 0),
                    ("o", att.o_proj, 1, 0),
                    ("ff_gate", mlp.gate_proj, 1, 0),
                    ("ff1", mlp.up_proj, 1, 0),
                    ("ff2", mlp.down_proj, 1, 0),
                ],
            )
        )
    return out


@dataclass(frozen=True)
class Spec:
    name: str
    arch: str  # modelvec's family name
    make: Callable[[], torch.nn.Module]
    core_attr: str | None  # the bare model inside the task head ("bert", "transformer", ...)
    prefix: str  # the prefix the task head adds to tensor names
    layers: Callable[[torch.nn.Module], list[LayerItems]]
    d_model: int = 32

    def core(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, self.core_attr) if self.core_attr and hasattr(model, self.core_attr) else model

    def items(self, model: torch.nn.Module) -> list[LayerItems]:
        return self.layers(self.core(model))


T = transformers
_LLAMA_KW = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: k, v are 32 x 16
    max_position_embeddings=32,
    bos_token_id=0,
    eos_token_id=1,
)
_BERT_KW = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
)
_T5_KW = dict(
    vocab_size=64, d_model=32, d_kv=6, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
)  # fmt: skip


def _bert_like_core(core) -> list[LayerItems]:
    return _bert_like(core.encoder)


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec("bert", "bert", lambda: T.BertModel(T.BertConfig(**_BERT_KW)), "bert", "", _bert_like_core),
        Spec(
            "bert-cls",
            "bert",
            lambda: T.BertForSequenceClassification(T.BertConfig(**_BERT_KW)),
            "bert",
            "bert.",
            _bert_like_core,
        ),
        Spec(
            "roberta-cls",
            "roberta",
            lambda: T.RobertaForSequenceClassification(
                T.RobertaConfig(**_BERT_KW, pad_token_id=1, bos_token_id=0, eos_token_id=2)
            ),
            "roberta",
            "roberta.",
            _bert_like_core,
        ),
        Spec(
            "distilbert-cls",
            "distilbert",
            lambda: T.DistilBertForSequenceClassification(
                T.DistilBertConfig(
                    vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32
                )
            ),
            "distilbert",
            "distilbert.",
            _distilbert,
        ),
        Spec(
            "t5-relu",
            "t5",
            lambda: T.T5ForConditionalGeneration(T.T5Config(**_T5_KW, feed_forward_proj="relu")),
            None,
            "",
            _t5,
        ),
        Spec(
            "t5-gated",
            "t5",
            lambda: T.T5ForConditionalGeneration(T.T5Config(**_T5_KW, feed_forward_proj="gated-gelu")),
            None,
            "",
            _t5,
        ),
        Spec(
            "gpt2-lm",
            "gpt2",
            lambda: T.GPT2LMHeadModel(
                T.GPT2Config(
                    vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
                )
            ),
            "transformer",
            "transformer.",
            _gpt2,
        ),
        Spec("llama-lm", "llama", lambda: T.LlamaForCausalLM(T.LlamaConfig(**_LLAMA_KW)), "model", "model.", _llama),
        Spec(
            "mistral-lm", "llama", lambda: T.MistralForCausalLM(T.MistralConfig(**_LLAMA_KW)), "model", "model.", _llama
        ),
        Spec("qwen2-lm", "llama", lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_LLAMA_KW)), "model", "model.", _llama),
        # Gemma: tied embeddings; Gemma 2: head_dim (16) set apart from hidden_size / heads (8)
        Spec(
            "gemma-lm",
            "gemma",
            lambda: T.GemmaForCausalLM(T.GemmaConfig(**_LLAMA_KW, head_dim=8)),
            "model",
            "model.",
            _llama,
        ),
        Spec(
            "gemma2-lm",
            "gemma",
            lambda: T.Gemma2ForCausalLM(T.Gemma2Config(**_LLAMA_KW, head_dim=16)),
            "model",
            "model.",
            _llama,
        ),
        # Phi-3: untied, fused qkv_proj (q 32 | k 16 | v 16 rows under grouped-query attention), fused gate_up_proj
        Spec(
            "phi3-lm",
            "phi3",
            lambda: T.Phi3ForCausalLM(T.Phi3Config(**_LLAMA_KW, pad_token_id=0)),
            "model",
            "model.",
            _phi3,
        ),
    )
}


# --- oriented matrices, planted deltas, reference vector ---------------------------------------------


def _slice(mod: torch.nn.Module, n_parts: int | tuple[int, ...], part: int) -> slice:
    """Equal parts of the output axis, or, given as a tuple, parts of those sizes."""
    if isinstance(n_parts, tuple):
        return slice(sum(n_parts[:part]), sum(n_parts[: part + 1]))
    out = mod.weight.shape[1] if isinstance(mod, Conv1D) else mod.weight.shape[0]
    width = out // n_parts
    return slice(part * width, (part + 1) * width)


def oriented(mod: torch.nn.Module, n_parts: int = 1, part: int = 0) -> torch.Tensor:
    """W in R^{in x out} such that mod(x) == x @ W + b (Conv1D stores [in, out], Linear [out, in])."""
    w = mod.weight.detach()
    sl = _slice(mod, n_parts, part)
    return w[:, sl] if isinstance(mod, Conv1D) else w[sl, :].T


def bias(mod: torch.nn.Module, n_parts: int = 1, part: int = 0) -> torch.Tensor | None:
    return None if mod.bias is None else mod.bias.detach()[_slice(mod, n_parts, part)]


def add_oriented(mod: torch.nn.Module, n_parts: int, part: int, delta: torch.Tensor) -> None:
    sl = _slice(mod, n_parts, part)
    with torch.no_grad():
        if isinstance(mod, Conv1D):
            mod.weight[:, sl] += delta
        else:
            mod.weight[sl, :] += delta.T


@dataclass
class Planted:
    a: torch.Tensor  # n x k, orthonormal columns: the planted column space
    s: torch.Tensor  # k planted singular values, decreasing and well separated


def plant(
    model: torch.nn.Module, spec: Spec, rank: int | None, where: Callable[[str, int, str], bool], seed: int
) -> dict:
    """Adds dW = A diag(s) B^T (oriented) to every selected matrix; returns the planted factors."""
    gen = torch.Generator().manual_seed(seed)
    planted = {}
    for stack, layer, items in spec.items(model):
        for family, mod, n_parts, part in items:
            n, m = oriented(mod, n_parts, part).shape
            k = min(n, m) if rank is None else min(rank, n, m)
            a = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))[0]
            b = torch.linalg.qr(torch.randn(m, k, generator=gen, dtype=torch.float64))[0]
            s = 0.5 * torch.linspace(1.0, 0.3, k, dtype=torch.float64)
            if not where(stack, layer, family):  # drawn anyway: the same deltas whatever is selected
                continue
            add_oriented(mod, n_parts, part, ((a * s) @ b.T).float())
            planted[(stack, layer, family)] = Planted(a, s)
    return planted


def ref_factor(delta: torch.Tensor, r: int, factor: str) -> torch.Tensor:
    """The definition, in float64: top-r U (or U S), max-abs signs, null columns zeroed, padded, column-wise."""
    n, m = delta.shape
    u, s, _ = torch.linalg.svd(delta.double(), full_matrices=False)
    k = min(r, n, m)
    u, s = u[:, :k], s[:k]
    live = s > s[0] * EPS32 * max(n, m)
    rows = u.abs().argmax(dim=0)
    signs = torch.sign(u[rows, torch.arange(k)])
    signs[signs == 0] = 1
    u = u * signs * live
    if factor == "US":
        u = u * s
    u = torch.cat([u, u.new_zeros(n, r - k)], dim=1)
    return u.T.reshape(-1)


def reference_vector(
    spec: Spec, base: torch.nn.Module, ft: torch.nn.Module, r: int, factor="U", pooling="mean"
) -> np.ndarray:
    stacks: dict[str, list[torch.Tensor]] = {}
    for (stack, layer, items_b), (stack_f, layer_f, items_f) in zip(spec.items(base), spec.items(ft), strict=True):
        assert (stack, layer) == (stack_f, layer_f)
        parts = []
        for (fam, mod_b, n_parts, part), (fam_f, mod_f, _, _) in zip(items_b, items_f, strict=True):
            assert fam == fam_f
            delta = oriented(mod_f, n_parts, part) - oriented(mod_b, n_parts, part)  # float32, as stored
            parts.append(ref_factor(delta, r, factor))
        stacks.setdefault(stack, []).append(torch.cat(parts))
    pooled = [torch.stack(v).mean(0) if pooling == "mean" else torch.cat(v) for v in stacks.values()]
    return torch.cat(pooled).numpy()


def reference_blocks(spec: Spec, model: torch.nn.Module, pooling="mean") -> list[tuple[str, int | None, str, int]]:
    """(stack, layer, family, n) for each block of the vector, in order."""
    out = []
    for stack, layer, items in spec.items(model):
        if pooling == "mean" and layer > 0:
            continue
        for fam, mod, n_parts, part in items:
            out.append((stack, layer if pooling == "concat" else None, fam, oriented(mod, n_parts, part).shape[0]))
    return out


# --- checkpoints on disk, built once per session -------------------------------------------------------

WHERE: dict[str, Callable[[str, int, str], bool]] = {
    "all": lambda stack, layer, family: True,
    "encoder": lambda stack, layer, family: stack == "encoder",
    "decoder": lambda stack, layer, family: stack == "decoder",
}


@dataclass
class Case:
    spec: Spec
    base: torch.nn.Module
    ft: torch.nn.Module
    planted: dict
    root: Path
    _dirs: dict = field(default_factory=dict)

    def folder(self, which: str, bare: bool = False) -> Path:
        """which: 'base' or 'ft'; bare: the model without its task head (unprefixed names)."""
        key = (which, bare)
        if key not in self._dirs:
            model = self.base if which == "base" else self.ft
            if bare:
                model = self.spec.core(model)
                assert model is not (self.base if which == "base" else self.ft), "no bare model inside"
            path = self.root / f"{which}{'-bare' if bare else ''}"
            model.save_pretrained(path)
            self._dirs[key] = path
        return self._dirs[key]


class Zoo:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cases: dict[tuple, Case] = {}

    def case(self, name: str, rank: int | None = 3, where: str = "all") -> Case:
        key = (name, rank, where)
        if key not in self.cases:
            spec = SPECS[name]
            torch.manual_seed(0)
            base = spec.make().eval()
            ft = copy.deepcopy(base)
            planted = plant(ft, spec, rank, WHERE[where], seed=1)
            root = self.tmp / f"{name}-r{rank}-{where}"
            root.mkdir()
            self.cases[key] = Case(spec, base, ft, planted, root)
        return self.cases[key]


# The description's method (rank-r SVD factor, no block normalisation), whatever the library's default.
DESCRIBED = dict(factor="U", block_norm=False, head="none")


def embed(case: Case, base_bare=False, ft_bare=False, **kw) -> tuple[DeltaEmbedder, np.ndarray]:
    kw.setdefault("solver", "exact")
    for key, value in DESCRIBED.items():
        kw.setdefault(key, value)
    e = DeltaEmbedder(**kw).fit(case.folder("base", base_bare))
    return e, e.embed_one(case.folder("ft", ft_bare))
