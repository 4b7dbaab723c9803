"""Architecture tables against real (tiny, random) ``transformers`` models.

Every test builds small random checkpoints with ``transformers`` and checks modelvec against code
written here from the definition, never against modelvec itself:

- the reference vector walks the *modules* of the ``transformers`` model (``nn.Linear`` weights
  transposed, GPT-2 ``Conv1D`` used as is, ``c_attn`` split in three), takes dW = W_ft - W_base,
  a float64 ``torch.linalg.svd``, max-abs signs, zeroed null columns, zero padding, column-wise
  flattening, family order, layer pooling and stack concatenation;
- orientation is checked by running the modules themselves: x @ W + b == module(x);
- fine-tunes carry planted low-rank deltas (orthonormal A, B and well-separated singular values),
  so singular vectors are well defined and the planted column space is known.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402

import modelvec  # noqa: E402
from modelvec import ArchitectureError, Checkpoint, DeltaEmbedder, detect  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

EPS32 = float(np.finfo(np.float32).eps)
ATOL = 1e-4

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
HEADED_WITH_BARE = ["bert-cls", "roberta-cls", "distilbert-cls", "gpt2-lm", "llama-lm"]


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


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("zoo"))


# The description's method (rank-r SVD factor, no block normalisation), whatever the library's default.
DESCRIBED = dict(factor="U", block_norm=False, head="none")


def embed(case: Case, base_bare=False, ft_bare=False, **kw) -> tuple[DeltaEmbedder, np.ndarray]:
    kw.setdefault("solver", "exact")
    for key, value in DESCRIBED.items():
        kw.setdefault(key, value)
    e = DeltaEmbedder(**kw).fit(case.folder("base", base_bare))
    return e, e.embed_one(case.folder("ft", ft_bare))


def block_u(e: DeltaEmbedder, vec: np.ndarray, block) -> np.ndarray:
    """A block of the vector back as its n x r factor."""
    return vec[block.start : block.stop].reshape(e.representation.rank, block.n).T


# --- 1. the vector equals the definition, family by family -------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_vector_matches_reference(zoo, name):
    case = zoo.case(name)
    r = 4  # planted rank 3: the 4th column of every block is a null direction, zeroed
    e, vec = embed(case, rank=r)
    assert e.layout_.arch.name == case.spec.arch
    assert vec.dtype == np.float32
    expected_blocks = reference_blocks(case.spec, case.base)
    assert [(b.stack, b.layer, b.family, b.n) for b in e.blocks_] == expected_blocks
    assert vec.shape == (sum(n for *_, n in expected_blocks) * r,) == (e.dim_,)
    np.testing.assert_allclose(vec, reference_vector(case.spec, case.base, case.ft, r), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert-cls", "t5-gated", "gpt2-lm", "llama-lm"])
@pytest.mark.parametrize("factor,pooling", [("US", "mean"), ("U", "concat"), ("US", "concat")])
def test_vector_matches_reference_other_choices(zoo, name, factor, pooling):
    case = zoo.case(name)
    e, vec = embed(case, rank=4, factor=factor, pooling=pooling)
    assert [(b.stack, b.layer, b.family, b.n) for b in e.blocks_] == reference_blocks(case.spec, case.base, pooling)
    expected = reference_vector(case.spec, case.base, case.ft, 4, factor, pooling)
    np.testing.assert_allclose(vec, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert-cls", "gpt2-lm", "llama-lm"])
def test_randomized_solver_matches_reference_on_low_rank_deltas(zoo, name):
    case = zoo.case(name)
    _, vec = embed(case, rank=4, solver="randomized")
    np.testing.assert_allclose(vec, reference_vector(case.spec, case.base, case.ft, 4), atol=1e-3, rtol=0)


@pytest.mark.parametrize("name", ["bert-cls", "llama-lm"])
def test_full_rank_delta_is_zero_padded_beyond_min_dim(zoo, name):
    """rank > min(n, m) = 16 or 32: every column up to min(n, m) is live, the rest are zero padding."""
    case = zoo.case(name, rank=None)  # full-rank planted deltas, well-separated singular values
    r = 40
    e, vec = embed(case, rank=r, pooling="concat")
    np.testing.assert_allclose(
        vec, reference_vector(case.spec, case.base, case.ft, r, pooling="concat"), atol=ATOL, rtol=0
    )
    shapes = {
        (stack, layer, fam): oriented(mod, n_parts, part).shape
        for stack, layer, items in case.spec.items(case.base)
        for fam, mod, n_parts, part in items
    }
    assert any(min(shape) == 16 for shape in shapes.values()) == (name == "llama-lm")  # GQA k, v: 32 x 16
    for b in e.blocks_:
        u = block_u(e, vec, b)
        k = min(shapes[(b.stack, b.layer, b.family)])
        assert k < r
        assert np.all(u[:, k:] == 0), b
        np.testing.assert_allclose(u[:, :k].T @ u[:, :k], np.eye(k), atol=1e-4)


# --- 2. GPT-2: Conv1D orientation and the fused q|k|v split -------------------------------------------


def _refs(layout, layer=0, stack=None):
    return {r.family: r for r in layout.refs if r.layer == layer and (stack is None or r.stack == stack)}


def test_gpt2_split_qkv_matches_c_attn(zoo):
    case = zoo.case("gpt2-lm")
    ck = Checkpoint(case.folder("base"))
    layout = ck.layout()
    assert layout.prefix == "transformer."
    d = 32
    torch.manual_seed(3)
    x = torch.randn(2, 5, d)
    for layer, block in enumerate(case.base.transformer.h):
        refs = _refs(layout, layer)
        with torch.no_grad():
            qkv = block.attn.c_attn(x).split(d, dim=-1)  # what GPT2Attention does
            b_q, b_k, b_v = block.attn.c_attn.bias.split(d)
            for fam, want, b in zip("qkv", qkv, (b_q, b_k, b_v)):
                w = ck.matrix(refs[fam], layout.prefix)
                assert w.shape == (d, d)
                torch.testing.assert_close(x @ w + b, want, atol=1e-5, rtol=1e-5)
            for fam, mod, shape in (
                ("o", block.attn.c_proj, (d, d)),
                ("ff1", block.mlp.c_fc, (d, 4 * d)),
                ("ff2", block.mlp.c_proj, (4 * d, d)),
            ):
                w = ck.matrix(refs[fam], layout.prefix)
                assert w.shape == shape  # Conv1D is [in, out]: used as is
                xin = torch.randn(2, 5, shape[0])
                torch.testing.assert_close(xin @ w + mod.bias, mod(xin), atol=1e-5, rtol=1e-5)


def test_gpt2_split_parts_differ_and_are_in_qkv_order(zoo):
    """Planted deltas: the k part of the fused delta must be recovered as k, not q or v."""
    case = zoo.case("gpt2-lm", rank=2)
    e, vec = embed(case, rank=2, pooling="concat")
    for b in e.blocks_:
        a = case.planted[(b.stack, b.layer, b.family)].a.numpy()
        u = block_u(e, vec, b)
        np.testing.assert_allclose(np.linalg.svd(a.T @ u, compute_uv=False), 1.0, atol=1e-4)


# --- 3. every matrix read by modelvec is the module's x @ W + b ---------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("bare", [False, True], ids=["headed", "bare"])
def test_matrices_are_in_x_at_w_orientation(zoo, name, bare):
    case = zoo.case(name)
    if bare and case.spec.core(case.base) is case.base:
        pytest.skip("no task head around this model")
    ck = Checkpoint(case.folder("base", bare))
    layout = ck.layout()
    assert layout.prefix == ("" if bare else case.spec.prefix)
    mods = {
        (stack, layer, fam): (mod, n_parts, part)
        for stack, layer, items in case.spec.items(case.base)
        for fam, mod, n_parts, part in items
    }
    assert [r.key for r in layout.refs] == list(mods)
    gen = torch.Generator().manual_seed(5)
    for ref in layout.refs:
        mod, n_parts, part = mods[ref.key]
        w = ck.matrix(ref, layout.prefix)
        x = torch.randn(2, 3, w.shape[0], generator=gen)
        with torch.no_grad():
            want = mod(x)[..., _slice(mod, n_parts, part)]
        b = bias(mod, n_parts, part)
        got = x @ w + (0 if b is None else b)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{ref.key}: {m}")


def test_linear_shapes_bert_and_llama_gqa(zoo):
    bert = Checkpoint(zoo.case("bert-cls").folder("base"))
    lb = bert.layout()
    refs = _refs(lb)
    shapes = {f: tuple(bert.matrix(refs[f], lb.prefix).shape) for f in refs}
    assert shapes == {"q": (32, 32), "k": (32, 32), "v": (32, 32), "o": (32, 32), "ff1": (32, 64), "ff2": (64, 32)}
    with torch.no_grad():
        x = torch.randn(2, 3, 32)
        query = zoo.case("bert-cls").base.bert.encoder.layer[0].attention.self.query
        torch.testing.assert_close(x @ bert.matrix(refs["q"], lb.prefix) + query.bias, query(x))

    llama = Checkpoint(zoo.case("llama-lm").folder("base"))
    ll = llama.layout()
    refs = _refs(ll)
    shapes = {f: tuple(llama.matrix(refs[f], ll.prefix).shape) for f in refs}
    kv = 2 * (32 // 4)  # num_key_value_heads * head_dim
    assert shapes == {
        "q": (32, 32), "k": (32, kv), "v": (32, kv), "o": (32, 32),
        "ff_gate": (32, 64), "ff1": (32, 64), "ff2": (64, 32),
    }  # fmt: skip


def test_t5_shapes_with_inner_dim_different_from_d_model(zoo):
    ck = Checkpoint(zoo.case("t5-gated").folder("base"))
    lay = ck.layout()
    inner = 4 * 6  # num_heads * d_kv = 24 != d_model = 32
    for stack in ("encoder", "decoder"):
        refs = _refs(lay, 0, stack)
        shapes = {f: tuple(ck.matrix(refs[f], lay.prefix).shape) for f in refs}
        want = {
            "q": (32, inner),
            "k": (32, inner),
            "v": (32, inner),
            "o": (inner, 32),
            "ff_gate": (32, 64),
            "ff1": (32, 64),
            "ff2": (64, 32),
        }
        if stack == "decoder":
            want.update({f"cross_{f}": want[f] for f in "qkvo"})
        assert shapes == want


# --- 4. T5: encoder-decoder, cross-attention, the two feed-forward variants -----------------------------

T5_FAMILIES = {
    "t5-relu": ["q", "k", "v", "o", "ff1", "ff2"],
    "t5-gated": ["q", "k", "v", "o", "ff_gate", "ff1", "ff2"],
}


@pytest.mark.parametrize("name", list(T5_FAMILIES))
def test_t5_family_sets_and_layer_counts(zoo, name):
    case = zoo.case(name)
    e, vec = embed(case, rank=2)
    enc = [b.family for b in e.blocks_ if b.stack == "encoder"]
    dec = [b.family for b in e.blocks_ if b.stack == "decoder"]
    attn, ff = T5_FAMILIES[name][:4], T5_FAMILIES[name][4:]
    assert enc == attn + ff
    assert dec == attn + ["cross_q", "cross_k", "cross_v", "cross_o"] + ff
    assert [b.stack for b in e.blocks_] == ["encoder"] * len(enc) + ["decoder"] * len(dec)  # encoder first
    layers = {}
    for ref in e.layout_.refs:
        layers.setdefault(ref.stack, set()).add(ref.layer)
    assert layers == {"encoder": {0, 1}, "decoder": {0, 1, 2}}  # num_layers=2, num_decoder_layers=3


@pytest.mark.parametrize("name", list(T5_FAMILIES))
@pytest.mark.parametrize("touched", ["encoder", "decoder"])
def test_t5_vector_is_encoder_then_decoder(zoo, name, touched):
    full = zoo.case(name)
    part = zoo.case(name, where=touched)  # same base, same planted deltas, only one stack touched
    r = 4
    e, vec_full = embed(full, rank=r)
    _, vec_part = embed(part, rank=r)
    split = max(b.stop for b in e.blocks_ if b.stack == "encoder")
    assert split == min(b.start for b in e.blocks_ if b.stack == "decoder")
    enc_full, dec_full = vec_full[:split], vec_full[split:]
    enc_part, dec_part = vec_part[:split], vec_part[split:]
    if touched == "decoder":
        assert np.all(enc_part == 0)
        np.testing.assert_array_equal(dec_part, dec_full)
    else:
        assert np.all(dec_part == 0)
        np.testing.assert_array_equal(enc_part, enc_full)
    assert np.abs(vec_part).max() > 0.1
    np.testing.assert_allclose(vec_part, reference_vector(part.spec, part.base, part.ft, r), atol=ATOL, rtol=0)


def test_t5_config_without_feed_forward_proj_is_relu(zoo, tmp_path):
    """Original t5-base config.json has no feed_forward_proj; the default is the relu FFN (wi)."""
    case = zoo.case("t5-relu")
    folders = {}
    for which in ("base", "ft"):
        dst = tmp_path / which
        shutil.copytree(case.folder(which), dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg.pop("feed_forward_proj", None)
        cfg.pop("dense_act_fn", None)
        cfg.pop("is_gated_act", None)
        (dst / "config.json").write_text(json.dumps(cfg))
        folders[which] = dst
    e = DeltaEmbedder(rank=4, solver="exact", **DESCRIBED).fit(folders["base"])
    assert {b.family for b in e.blocks_ if b.stack == "encoder"} == {"q", "k", "v", "o", "ff1", "ff2"}
    np.testing.assert_array_equal(e.embed_one(folders["ft"]), embed(case, rank=4)[1])


# --- 5. task-head prefixes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADED_WITH_BARE)
def test_prefixed_and_unprefixed_names_align(zoo, name):
    case = zoo.case(name)
    prefixes = {}
    vectors = {}
    for base_bare, ft_bare in itertools.product([True, False], repeat=2):
        e, vec = embed(case, base_bare=base_bare, ft_bare=ft_bare, rank=4)
        prefixes[base_bare] = e.layout_.prefix
        vectors[(base_bare, ft_bare)] = vec
    assert prefixes == {True: "", False: case.spec.prefix}
    ref = vectors[(True, True)]
    assert np.abs(ref).max() > 0.1
    for key, vec in vectors.items():
        np.testing.assert_array_equal(vec, ref, err_msg=f"base_bare, ft_bare = {key}")
    np.testing.assert_allclose(ref, reference_vector(case.spec, case.base, case.ft, 4), atol=ATOL, rtol=0)


def test_bare_checkpoint_really_has_no_prefix(zoo):
    """Guards the test above: the bare and headed folders do differ in their tensor names."""
    case = zoo.case("bert-cls")
    bare = Checkpoint(case.folder("base", bare=True)).keys()
    headed = Checkpoint(case.folder("base")).keys()
    assert "encoder.layer.0.attention.self.query.weight" in bare
    assert "bert.encoder.layer.0.attention.self.query.weight" in headed
    assert any(k.startswith("classifier.") for k in headed) and not any(k.startswith("bert.") for k in bare)


# --- 6. a planted rank-2 delta is recovered ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert-cls", "distilbert-cls", "t5-gated", "gpt2-lm", "llama-lm"])
def test_planted_rank2_is_recovered(zoo, name):
    case = zoo.case(name, rank=2)
    r = 8
    e, vec = embed(case, rank=r, pooling="concat")
    assert len(e.blocks_) == len(case.planted)
    for b in e.blocks_:
        u = block_u(e, vec, b)
        assert u.shape == (b.n, r)
        assert np.all(u[:, 2:] == 0), f"{b}: columns beyond the planted rank are not zero"
        np.testing.assert_allclose(u[:, :2].T @ u[:, :2], np.eye(2), atol=1e-5)
        a = case.planted[(b.stack, b.layer, b.family)].a.numpy()
        cosines = np.linalg.svd(a.T @ u[:, :2], compute_uv=False)  # cosines of the principal angles
        np.testing.assert_allclose(cosines, 1.0, atol=1e-5, err_msg=str(b))
        # max-abs signs: each column's largest-magnitude entry is positive
        cols = u[:, :2]
        assert np.all(cols[np.abs(cols).argmax(0), [0, 1]] > 0)

    # U S: column norms are the planted singular values
    e, vec_us = embed(case, rank=r, pooling="concat", factor="US")
    for b in e.blocks_:
        us = block_u(e, vec_us, b)
        planted = case.planted[(b.stack, b.layer, b.family)].s.numpy()
        np.testing.assert_allclose(np.linalg.norm(us, axis=0), np.r_[planted, np.zeros(r - 2)], atol=1e-5)

    # mean pooling keeps the null columns at zero
    e, vec_mean = embed(case, rank=r)
    for b in e.blocks_:
        assert np.all(block_u(e, vec_mean, b)[:, 2:] == 0)


def test_untouched_matrix_gives_zero_block(zoo):
    case = zoo.case("t5-relu", where="encoder")
    e, vec = embed(case, rank=4, pooling="concat")
    for b in e.blocks_:
        block = vec[b.start : b.stop]
        assert np.all(block == 0) if b.stack == "decoder" else np.abs(block).max() > 0.1


# --- 7. detection ----------------------------------------------------------------------------------------

MODEL_TYPES = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "distilbert": "distilbert",
    "t5": "t5",
    "mt5": "t5",
    "gpt2": "gpt2",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma": "gemma",
    "gemma2": "gemma",
    "phi3": "phi3",
}
ARCH_CLASSES = {
    "BertForMaskedLM": "bert",
    "BertModel": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForMaskedLM": "roberta",
    "DistilBertForSequenceClassification": "distilbert",
    "T5ForConditionalGeneration": "t5",
    "MT5ForConditionalGeneration": "t5",
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi3",
}


@pytest.mark.parametrize("model_type,arch", list(MODEL_TYPES.items()))
def test_detect_from_model_type(model_type, arch):
    assert detect({"model_type": model_type}).name == arch
    # model_type wins over a misleading architectures entry
    assert detect({"model_type": model_type, "architectures": ["SomethingElse"]}).name == arch


@pytest.mark.parametrize("cls,arch", list(ARCH_CLASSES.items()))
def test_detect_from_architectures_when_model_type_absent(cls, arch):
    assert detect({"architectures": [cls]}).name == arch


@pytest.mark.parametrize("name", ["bert-cls", "t5-gated", "gpt2-lm", "mistral-lm", "qwen2-lm"])
def test_detect_from_saved_config_with_and_without_model_type(zoo, tmp_path, name):
    case = zoo.case(name)
    assert Checkpoint(case.folder("base")).architecture().name == case.spec.arch
    folders = {}
    for which in ("base", "ft"):
        dst = tmp_path / which
        shutil.copytree(case.folder(which), dst)
        cfg = json.loads((dst / "config.json").read_text())
        del cfg["model_type"]
        assert cfg["architectures"]
        (dst / "config.json").write_text(json.dumps(cfg))
        folders[which] = dst
    assert Checkpoint(folders["base"]).architecture().name == case.spec.arch
    e = DeltaEmbedder(rank=4, solver="exact", **DESCRIBED).fit(folders["base"])
    np.testing.assert_array_equal(e.embed_one(folders["ft"]), embed(case, rank=4)[1])


def _assert_lists_supported(err: ArchitectureError) -> None:
    msg = str(err)
    assert "supported model types" in msg
    for model_type in MODEL_TYPES:
        assert model_type in msg


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "mamba"},
        {"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
        {"architectures": ["MambaForCausalLM"]},
        {"model_type": "bart", "architectures": ["BartForConditionalGeneration"]},
    ],
)
def test_unknown_architecture_is_an_error_listing_supported_types(config):
    with pytest.raises(ArchitectureError) as info:
        detect(config, model="some/model")
    assert str(info.value).startswith("some/model: ")
    _assert_lists_supported(info.value)


@pytest.mark.parametrize(
    "model_type,cls",
    [
        ("qwen2_moe", "Qwen2MoeForCausalLM"),  # experts, no mlp.gate_proj: not the Llama table
        ("t5gemma", "T5GemmaForConditionalGeneration"),  # not T5's tensor layout
        ("mistral3", "Mistral3ForConditionalGeneration"),
    ],
)
def test_unknown_model_type_is_not_rescued_by_a_class_name_prefix(model_type, cls):
    """model_type is given and unknown: architectures is only consulted when model_type is absent.

    A class name that merely starts with a supported prefix ("Qwen2Moe...", "T5Gemma...") belongs
    to another model type; it must give the ArchitectureError that lists the supported types, not
    a family whose tensors are then missing.
    """
    with pytest.raises(ArchitectureError) as info:
        detect({"model_type": model_type, "architectures": [cls]}, model="m")
    _assert_lists_supported(info.value)


def test_unknown_model_type_in_a_checkpoint_folder(zoo, tmp_path):
    case = zoo.case("bert-cls")
    dst = tmp_path / "weird"
    shutil.copytree(case.folder("base"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = "weirdformer"
    cfg["architectures"] = ["WeirdformerModel"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArchitectureError) as info:
        DeltaEmbedder(rank=2).fit(dst)
    assert "weirdformer" in str(info.value)
    _assert_lists_supported(info.value)
    assert isinstance(info.value, modelvec.ModelvecError)


# --- 6. how deltas are batched does not change the vector ---------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("factor", ["sketch", "U"])
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 200], ids=["one-chunk", "many-chunks"])
def test_family_batching_and_streamed_chunks_give_the_layer_vector(zoo, name, factor, chunk_bytes, monkeypatch):
    """Per layer (CPU; the sketch streamed in chunks, here also forced to many tiny chunks) and per
    family over all layers (the GPU path, run here on the CPU) compute the same vector by different
    code: the chunked sums against one batched product, nn.Linear and Conv1D storage, fused c_attn."""
    from modelvec.represent import embedder as representation
    from modelvec.represent.linalg import sketch_matrix

    monkeypatch.setattr(representation, "_CHUNK_BYTES", chunk_bytes)
    case = zoo.case(name)
    kw = dict(rank=4, factor=factor, solver="exact", block_norm=factor == "sketch", projection="shared", rows=1)
    by_layer, by_family = (DeltaEmbedder(**kw, batching=b).fit(case.folder("base", False)) for b in ("layer", "family"))
    assert not by_layer.by_family and by_family.by_family
    a, b = (e.embed_one(case.folder("ft", False)) for e in (by_layer, by_family))
    assert np.abs(a).max() > 0
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if factor == "sketch":  # and both equal the definition: (dW @ Omega)^T of every matrix, block-normalised
        e = DeltaEmbedder(**{**kw, "block_norm": False}, pooling="concat").fit(case.folder("base", False))
        vec = e.embed_one(case.folder("ft", False))
        ck, base = Checkpoint(case.folder("ft", False)), Checkpoint(case.folder("base", False))
        for ref, block in zip(e.layout_.refs, e.blocks_):
            d = ck.matrix(ref, ck.layout().prefix) - base.matrix(ref, base.layout().prefix)
            expected = (d @ sketch_matrix(d.shape[1], 4, 0)).T.reshape(-1)
            np.testing.assert_allclose(vec[block.start : block.stop], expected.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("factor", ["sketch", "U"])
def test_cuda_vector_equals_cpu_vector(zoo, name, factor):
    case = zoo.case(name)
    kw = dict(rank=4, factor=factor, block_norm=factor == "sketch")
    cpu = DeltaEmbedder(**kw).fit(case.folder("base", False))
    gpu = DeltaEmbedder(**kw, device="cuda").fit(case.folder("base", False))
    assert gpu.by_family and gpu.device.type == "cuda"
    np.testing.assert_allclose(
        gpu.embed_one(case.folder("ft", False)), cpu.embed_one(case.folder("ft", False)), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "model_type, parent, make",
    [
        ("xlm-roberta", "roberta", lambda: T.XLMRobertaModel(T.XLMRobertaConfig(**_BERT_KW))),
        ("camembert", "roberta", lambda: T.CamembertModel(T.CamembertConfig(**_BERT_KW))),
        ("mt5", "t5", lambda: T.MT5Model(T.MT5Config(**_T5_KW))),
    ],
)
def test_model_types_that_share_a_family_table(tmp_path, model_type, parent, make):
    """The model types the README lists beside a family are read by that family's table: a real
    tiny model of the type embeds to a non-zero vector, the same as with its config saying the
    parent type (same tensors, same roles)."""
    torch.manual_seed(0)
    model = make()
    model.save_pretrained(tmp_path / "base")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "ft")
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["model_type"] == model_type
    e = DeltaEmbedder(rank=2).fit(tmp_path / "base")
    assert e.layout_.arch.name == parent
    vec = e.embed_one(tmp_path / "ft")
    relabelled = tmp_path / "relabelled"
    shutil.copytree(tmp_path / "ft", relabelled)
    config = json.loads((relabelled / "config.json").read_text())
    config["model_type"] = parent
    (relabelled / "config.json").write_text(json.dumps(config))
    assert np.abs(vec).sum() > 0
    np.testing.assert_array_equal(vec, e.embed_one(relabelled))
