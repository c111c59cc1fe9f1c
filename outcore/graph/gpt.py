"""A GPT-style decoder as a layer graph, built without torch (for models too large to build here).

The graph is what ``outcore.capture`` would record for a GPT-2/Megatron-style decoder (Radford et
al. 2019; Shoeybi et al., "Megatron-LM", 2019, figure 2), one node per layer call:

    tokens -> wte (Embedding) -> [block] x L -> ln_f -> lm_head (Linear) -> cross_entropy
    block:  x -> ln_1 -> q, k, v (Linear d->d) -> view (heads, head_dim) -> sdpa -> view back
              -> proj (Linear d->d) -> add(x) -> ln_2 -> fc1 (Linear d->4d) -> gelu
              -> fc2 (Linear 4d->d) -> add

Every node carries what :func:`outcore.graph.tensor_pairs.find_layout` needs to pair it
Megatron-style (ops, module paths, ``meta['module_types']``, ``attrs['config']`` with the
Linear / Embedding sizes, ``attrs['shape']`` / ``attrs['in_shapes']``), and what
:func:`outcore.cost.analytical.estimate` needs to cost it for a device preset: ``attrs['flops']``
(forward, 2 per multiply-add; causal attention counts the half of ``QK^T`` and ``AV`` a
causal kernel computes) and ``attrs['dtype']``. Times are left at 0: call ``estimate(g, "a100")``.

Precision (mixed-precision training as Megatron / AxoNN run it, Micikevicius et al. 2018):
activations in ``dtype`` (bf16: 2 bytes); ``param_bytes`` counts **4 bytes per parameter**, so
the planner's Adam memory model (4 x param_bytes) gives the 16 bytes per parameter of bf16
weights + gradients + fp32 master weights and two moments (Rajbhandari et al., ZeRO, section 3.1),
and data-parallel gradient all-reduces are sized as fp32 gradients. ``saved_bytes`` follow what
autograd keeps per layer without recomputation (each Linear / LayerNorm / GeLU its input, the
attention kernel q, k, v, its output and the row statistics, as flash attention does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.errors import UsageError
from outcore.graph.ir import Graph, build

PARAM_BYTES_PER_PARAM = 4  # fp32 master copy: x4 (Adam) = 16 bytes/param of mixed precision
_ITEM = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class GPTShape:
    """A decoder's sizes: ``layers`` blocks of width ``hidden`` with ``heads`` heads."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    seq: int = 2048

    @property
    def params(self) -> int:
        """Parameters: 12 L d^2 + 13 L d (weights, biases, LayerNorms) + 2 V d + 2 d."""
        d, L, V = self.hidden, self.layers, self.vocab
        return 12 * L * d * d + 13 * L * d + 2 * V * d + 2 * d

    def model_flops(self, tokens: float) -> float:
        """Training FLOPs for ``tokens`` without recomputation (Narayanan et al., SC 2021,
        section 5.1): ``72 T L d^2 (1 + s / 6d + V / 12 L d)`` = 6 x params x tokens + attention."""
        d, L, V, s = self.hidden, self.layers, self.vocab, self.seq
        return 72.0 * tokens * L * d * d * (1 + s / (6 * d) + V / (12 * L * d))


class _Builder:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.src: list[int] = []
        self.dst: list[int] = []

    def add(self, name: str, op: str, module: str, inputs: list[int], *, shape: list[int],
            in_shapes: list[list[int]], out_bytes: float, param_bytes: float = 0.0,
            saved_bytes: float = 0.0, flops: float = 0.0, dtype: str = "bfloat16",
            config: dict[str, int] | None = None) -> int:
        i = len(self.rows)
        attrs: dict[str, Any] = {"shape": shape, "in_shapes": in_shapes, "dtype": dtype}
        if flops:
            attrs["flops"] = float(flops)
        if config:
            attrs["config"] = config
        if param_bytes:
            attrs["params"] = [f"{module}.weight"]
        self.rows.append({"name": name, "op": op, "module": module, "attrs": attrs,
                          "out": out_bytes, "param": param_bytes, "saved": saved_bytes})
        for p in inputs:
            self.src.append(p)
            self.dst.append(i)
        return i


def _block(b: _Builder, x: int, i: int, sh: GPTShape, batch: int, item: int) -> int:
    d, h, s = sh.hidden, sh.heads, sh.seq
    act, bsd = [batch, s, d], batch * s * d * item
    pre = f"h.{i}"

    def linear(name: str, src: int, fin: int, fout: int) -> int:
        return b.add(f"{pre}.{name}", "linear", f"{pre}.{name}", [src],
                     shape=[batch, s, fout], in_shapes=[[batch, s, fin]],
                     out_bytes=batch * s * fout * item,
                     param_bytes=(fin * fout + fout) * PARAM_BYTES_PER_PARAM,
                     saved_bytes=batch * s * fin * item, flops=2.0 * batch * s * fin * fout,
                     config={"in_features": fin, "out_features": fout})

    def norm(name: str, src: int) -> int:
        return b.add(f"{pre}.{name}", "layernorm", f"{pre}.{name}", [src], shape=act,
                     in_shapes=[act], out_bytes=bsd, param_bytes=2 * d * PARAM_BYTES_PER_PARAM,
                     saved_bytes=bsd)

    ln1 = norm("ln_1", x)
    heads_shape = [batch, s, h, d // h]
    views = []
    for p in ("q", "k", "v"):
        lin = linear(f"attn.{p}", ln1, d, d)
        views.append(b.add(f"{pre}.attn.view_{p}", "view", f"{pre}.attn", [lin],
                           shape=heads_shape, in_shapes=[act], out_bytes=bsd))
    attn = b.add(f"{pre}.attn.sdpa", "scaled_dot_product_attention", f"{pre}.attn", views,
                 shape=heads_shape, in_shapes=[heads_shape] * 3, out_bytes=bsd,
                 saved_bytes=4 * bsd + batch * h * s * 4,
                 flops=2.0 * batch * s * s * d)  # causal: half of 4 b s^2 d
    merged = b.add(f"{pre}.attn.view_out", "view", f"{pre}.attn", [attn], shape=act,
                   in_shapes=[heads_shape], out_bytes=bsd)
    proj = linear("attn.proj", merged, d, d)
    x1 = b.add(f"{pre}.add_1", "add", pre, [x, proj], shape=act, in_shapes=[act, act],
               out_bytes=bsd, flops=batch * s * d)
    ln2 = norm("ln_2", x1)
    fc1 = linear("mlp.fc1", ln2, d, 4 * d)
    act4 = [batch, s, 4 * d]
    gelu = b.add(f"{pre}.mlp.gelu", "gelu", f"{pre}.mlp.act", [fc1], shape=act4,
                 in_shapes=[act4], out_bytes=4 * bsd, saved_bytes=4 * bsd,
                 flops=12.0 * batch * s * 4 * d)
    fc2 = linear("mlp.fc2", gelu, 4 * d, d)
    return b.add(f"{pre}.add_2", "add", pre, [x1, fc2], shape=act, in_shapes=[act, act],
                 out_bytes=bsd, flops=batch * s * d)


def make_gpt(shape: GPTShape, *, batch: int = 1, dtype: str = "bfloat16",
             name: str = "gpt") -> Graph:
    """The layer graph of a GPT-style decoder for ``batch`` sequences (see module docstring).

    Args:
        shape: layers, hidden width, heads, vocabulary, sequence length.
        batch: sequences per micro-batch the sizes are for (``Graph.batch_size``).
        dtype: activation precision (``bfloat16``, ``float16`` or ``float32``).
    """
    sh = shape
    if sh.layers < 1 or sh.hidden < 1 or sh.heads < 1 or sh.hidden % sh.heads or batch < 1:
        raise UsageError(f"make_gpt needs layers, hidden, heads, batch >= 1 and heads dividing "
                         f"hidden; got {sh} with batch {batch}")
    if dtype not in _ITEM:
        raise UsageError(f"make_gpt: unknown dtype {dtype!r}; use one of {sorted(_ITEM)}")
    item = _ITEM[dtype]
    d, s, V = sh.hidden, sh.seq, sh.vocab
    act, bsd = [batch, s, d], batch * s * d * item
    b = _Builder()
    tok = b.add("tokens", "input", "", [], shape=[batch, s], in_shapes=[],
                out_bytes=batch * s * 8, dtype="int64")
    x = b.add("wte", "embedding", "wte", [tok], shape=act, in_shapes=[[batch, s]],
              out_bytes=bsd, param_bytes=V * d * PARAM_BYTES_PER_PARAM, saved_bytes=batch * s * 8,
              config={"num_embeddings": V, "embedding_dim": d})
    for i in range(sh.layers):
        x = _block(b, x, i, sh, batch, item)
    ln_f = b.add("ln_f", "layernorm", "ln_f", [x], shape=act, in_shapes=[act], out_bytes=bsd,
                 param_bytes=2 * d * PARAM_BYTES_PER_PARAM, saved_bytes=bsd)
    head = b.add("lm_head", "linear", "lm_head", [ln_f], shape=[batch, s, V], in_shapes=[act],
                 out_bytes=batch * s * V * item, param_bytes=V * d * PARAM_BYTES_PER_PARAM,
                 saved_bytes=bsd, flops=2.0 * batch * s * d * V,
                 config={"in_features": d, "out_features": V})
    b.add("loss", "cross_entropy", "", [head], shape=[], in_shapes=[[batch, s, V]],
          out_bytes=4, saved_bytes=batch * s * V * 4, flops=4.0 * batch * s * V)
    return _graph(b, sh, batch, dtype, name)


def _graph(b: _Builder, sh: GPTShape, batch: int, dtype: str, name: str) -> Graph:
    rows = b.rows
    out = np.array([r["out"] for r in rows], dtype=np.float64)
    src = np.array(b.src, dtype=np.int64)
    types = {r["module"]: _TYPES[r["op"]] for r in rows if r["op"] in _TYPES}
    types.update({f"h.{i}.mlp.act": "GELU" for i in range(sh.layers)})
    return build(name, fwd_s=np.zeros(len(rows)), bwd_s=np.zeros(len(rows)), src=src,
                 dst=np.array(b.dst, dtype=np.int64), edge_bytes=out[src] if src.size else None,
                 param_bytes=[r["param"] for r in rows], out_bytes=out,
                 saved_bytes=[r["saved"] for r in rows], names=[r["name"] for r in rows],
                 ops=[r["op"] for r in rows], modules=[r["module"] for r in rows],
                 attrs=[r["attrs"] for r in rows], batch_size=batch,
                 meta={"generator": "gpt", "module_types": types, "dtype": dtype,
                       "gpt": {"layers": sh.layers, "hidden": sh.hidden, "heads": sh.heads,
                               "vocab": sh.vocab, "seq": sh.seq, "params": sh.params}})


_TYPES = {"linear": "Linear", "embedding": "Embedding", "layernorm": "LayerNorm"}
