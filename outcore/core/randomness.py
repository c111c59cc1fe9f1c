"""Random ops that do not depend on placement: dropout drawn per sample, step and node.

Plain PyTorch draws every dropout mask from one global generator, in execution order, so the
masks depend on which ops ran before on the same process, and on how the batch is grouped:
a model split over K ranks, or its batch over data-parallel copies and micro-batches, would
draw other masks than one rank does, and its losses would differ. outcore runs every random
node (dropout, drop-path, ``bernoulli``, ``rand*``) sample by sample along its input's first
dimension, reseeding the generator before each from ``(run seed, step, sample, node name)``
(the sample's place in the global batch: micro-batch chunks are equal, so chunk ``c`` of
``n`` rows starts at row ``c * n``): the same sample sees the same mask on one rank or K, in
any layout and schedule, and again when a checkpointed piece is recomputed. A random node
without a tensor input (``torch.rand(shape)``) is reseeded once per chunk instead, and one with
a drop probability of 0 runs as it is. Under tensor parallelism a random node whose value is
split over the group (dropout between a Megatron pair's layers, on a rank's columns or heads)
draws the whole sample's mask and keeps its shard of it (:func:`set_shards`), so the ranks
together draw one device's mask.

This does *not* reproduce plain PyTorch's masks (its draws depend on the global order), so
with dropout on, outcore's losses equal across placements but not plain PyTorch's.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx

_context = threading.local()

RANDOM_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                    "feature_alpha_dropout", "feature_dropout", "native_dropout", "drop_path",
                    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like",
                    "randint", "randint_like", "randperm", "normal", "normal_", "uniform_",
                    "multinomial", "exponential_", "random_", "stochastic_depth",
                    "scaled_dot_product_attention")  # (random with a dropout_p above 0)


def set_context(seed: int, step: int, chunk: int, samples: int = 0) -> None:
    """The run seed, step and micro-batch chunk the next random nodes draw for, and how many
    samples a chunk holds (0: unknown, a random node's first dimension is taken as them)."""
    _context.key = (int(seed), int(step), int(chunk))
    _context.samples = int(samples)


def set_shards(index: int, count: int, shapes: Mapping[str, Any], batch: int) -> None:
    """Tensor parallelism: this rank holds shard ``index`` of ``count`` of every value split
    over its group, in ``torch.chunk``'s order; ``shapes`` gives each node's whole value's
    shape at ``batch`` samples (the captured graph's). A random node whose sample is smaller
    than the whole one along one dimension draws the whole sample and keeps its shard."""
    whole = {}
    for name, shape in shapes.items():
        if shape and isinstance(shape[0], (list, tuple)):  # a tuple's first value
            shape = shape[0]
        if shape and all(isinstance(d, int) for d in shape) and batch and shape[0] % batch == 0:
            whole[name] = (shape[0] // batch, *shape[1:])
    _SHARDS.update(index=int(index), count=int(count), whole=whole)


def _shard_span(node: str, sample: tuple[int, ...]) -> tuple[int, int] | None:
    """How a sample of random node ``node`` (its local shape ``sample``) is split over the
    tensor-parallel group: (dimension, ranks), or None where it is whole (or split unevenly)."""
    whole = _SHARDS.get("whole", {}).get(node)
    if whole is None or len(whole) != len(sample) or tuple(whole) == sample:
        return None
    dims = [d for d in range(len(sample)) if whole[d] != sample[d]]
    count = _SHARDS["count"]
    if len(dims) != 1 or whole[dims[0]] != sample[dims[0]] * count:
        return None
    return dims[0], count


def _in_whole(x: torch.Tensor, dim: int, count: int) -> torch.Tensor:
    """This rank's shard ``x`` placed in a whole value of zeros (``count`` shards along
    ``dim``, in rank order); autograd hands back its slice."""
    size, index = int(x.shape[dim]), _SHARDS["index"]
    parts = [x.new_zeros((*x.shape[:dim], size * index, *x.shape[dim + 1:]))] if index else []
    parts.append(x)
    if index < count - 1:
        parts.append(x.new_zeros((*x.shape[:dim], size * (count - 1 - index),
                                  *x.shape[dim + 1:])))
    return torch.cat(parts, dim)


def _shard_of(y: Any, dim: int, count: int) -> Any:
    """This rank's shard of a whole result (a copy, so the whole one is freed)."""
    if isinstance(y, (tuple, list)):
        return type(y)(_shard_of(v, dim, count) for v in y)
    if not isinstance(y, torch.Tensor) or y.dim() <= dim:
        return y
    size = int(y.shape[dim]) // count
    return y.narrow(dim, size * _SHARDS["index"], size).clone()


def reseed(node: str, row: int | None = None) -> None:
    """Seed the generators random node ``node`` draws from (the CPU's, and the current CUDA
    device's once CUDA is in use) in the current context, for sample ``row`` of the global batch
    (None: for the whole chunk).

    ``torch.manual_seed`` would seed the same generators to the same value, but it also visits
    every other backend: 57 us a call here against 0.9 us for the CPU generator alone, paid by
    every sample of every random node."""
    seed, step, chunk = getattr(_context, "key", (0, 0, 0))
    where = chunk if row is None else f"s{row}"
    digest = hashlib.blake2b(f"{seed}/{step}/{where}/{node}".encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(value)


def per_sample(node: str, target: str, *args: Any, **kwargs: Any) -> Any:
    """Run random node ``node`` (``target``: a key of :data:`_TARGETS`) one sample at a time,
    each reseeded for its place in the global batch, and join the results along dim 0 (a
    first dimension of samples x tokens splits into each sample's tokens)."""
    fn = _TARGETS[target]
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if first is None or first.dim() == 0:
        reseed(node)
        return fn(*args, **kwargs)
    rows = int(first.shape[0])
    samples = getattr(_context, "samples", 0) or rows
    if rows % samples:  # its first dimension is not the samples' (nor sample-major rows)
        reseed(node)
        return fn(*args, **kwargs)
    chunk = getattr(_context, "key", (0, 0, 0))[2]
    step = rows // samples  # rows a sample has: a flattened (samples x tokens) tensor has many
    if "scaled_dot_product_attention" in target:
        return _attention(node, chunk, samples, *args, **kwargs)

    in_place = target.endswith(_IN_PLACE)

    def rows_of(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() and int(x.shape[0]) == rows:
            if in_place:  # views of the tensor the op writes, sample by sample
                return [x.narrow(0, i * step, step) for i in range(samples)]
            return torch.split(x, step)  # one split, whose backward is one concatenation
        return None

    split_args = [rows_of(a) for a in args]
    split_kwargs = {k: rows_of(v) for k, v in kwargs.items()}
    span = _shard_span(node, (step, *(int(d) for d in first.shape[1:])))
    parts = []
    for i in range(samples):
        reseed(node, chunk * samples + i)
        a = [v if r is None else r[i] for v, r in zip(args, split_args)]
        k = {n: v if split_kwargs[n] is None else split_kwargs[n][i] for n, v in kwargs.items()}
        if span is None:
            parts.append(fn(*a, **k))
            continue
        # a shard of the sample: draw the whole sample's numbers, keep this rank's shard
        dim, count = span

        def whole(v: Any) -> Any:
            if not isinstance(v, torch.Tensor) or v.dim() != first.dim():
                return v
            return _in_whole(v, dim, count)
        y = _shard_of(fn(*[whole(v) for v in a], **{n: whole(v) for n, v in k.items()}),
                      dim, count)
        if in_place:
            a[0].copy_(y)
        parts.append(y)
    if in_place:  # the tensor written, as the op returns it
        return first
    if isinstance(parts[0], (tuple, list)):  # native_dropout: (output, mask)
        return type(parts[0])(torch.cat([p[k] for p in parts]) for k in range(len(parts[0])))
    return torch.cat(parts)


def _attention(node: str, chunk: int, samples: int, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` with dropout: each sample's dropout mask is drawn for
    its place in the global batch (for every head, and a tensor-parallel rank keeps its heads'
    part), then the attention runs once for the micro-batch, as PyTorch's math kernel computes
    it (the one it picks for attention dropout on a CPU)."""
    rows = int(query.shape[0])
    step = rows // samples
    scores = (*query.shape[:-1], int(key.shape[-2]))  # the attention matrix's shape
    span = _shard_span(node, (step, *(int(d) for d in query.shape[1:-1]),
                              int(value.shape[-1])))
    keep = []
    for i in range(samples):
        reseed(node, chunk * samples + i)
        shape = [step, *scores[1:]]
        if span is not None:
            shape[span[0]] *= span[1]
        drawn = torch.rand(shape, device=query.device) >= dropout_p
        if span is not None:
            size = int(scores[span[0]])
            drawn = drawn.narrow(span[0], size * _SHARDS["index"], size)
        keep.append(drawn)
    if enable_gqa and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        groups = int(query.shape[-3]) // int(key.shape[-3])
        key = key.repeat_interleave(groups, -3)
        value = value.repeat_interleave(groups, -3)
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(int(query.shape[-1])))
    attn = (query * factor) @ (key * factor).transpose(-2, -1)
    if is_causal:
        causal = torch.ones(scores[-2:], dtype=torch.bool, device=query.device).tril()
        attn = attn.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        attn = attn.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else attn + attn_mask
    # as the math kernel: a row every key of which is masked attends to nothing (not NaN)
    softmax = getattr(torch.ops.aten, "_safe_softmax", torch.softmax)
    attn = softmax(attn, -1).masked_fill(~torch.cat(keep), 0.0)
    return attn @ (value * (1.0 / (1.0 - dropout_p)))


class _PerSample(torch.nn.Module):
    """A random layer (``nn.Dropout``, timm's ``DropPath``) run by :func:`per_sample`."""

    def __init__(self, inner: torch.nn.Module, node: str):
        super().__init__()
        self.inner, self.node = inner, node
        self.key = f"module:{id(inner)}" + (_IN_PLACE if getattr(inner, "inplace", False)
                                            else "")
        _TARGETS.setdefault(self.key, inner)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.inner.training:
            return self.inner(*args, **kwargs)
        return per_sample(self.node, self.key, *args, **kwargs)


# tensor parallelism: this rank's shard index and count, and the random nodes' whole samples
_SHARDS: dict[str, Any] = {}

# the callables random nodes run, by key (functions by qualified name, layers by id, methods
# as "method:<name>"): fx's generated code names the key, not the object
_TARGETS: dict[str, Any] = {}
_IN_PLACE = "/in-place"  # the end of a key whose op writes its first input (dropout_, inplace=)


def _method(name: str) -> Any:
    return lambda self, *args, **kwargs: getattr(self, name)(*args, **kwargs)


torch.fx.wrap("reseed")
torch.fx.wrap("per_sample")


def is_random(n: fx.Node, gm: torch.nn.Module) -> bool:
    """Whether an fx node may draw random numbers."""
    if n.op == "call_module":
        kind = type(gm.get_submodule(str(n.target))).__name__.lower()
        return "dropout" in kind or "droppath" in kind or "stochasticdepth" in kind
    if n.op in ("call_function", "call_method"):
        return _op_name(n) in RANDOM_FUNCTIONS
    return False


def _op_name(n: fx.Node) -> str:
    """A function or method node's operator name (``dropout`` of ``aten.dropout.default``)."""
    return getattr(n.target, "__name__", str(n.target)).split(".")[0]


def _never_drops(n: fx.Node, gm: torch.nn.Module) -> bool:
    """A dropout node with a literal probability of 0 or in eval mode (a Hugging Face model's
    ``dropout=0``): it draws nothing, so it runs as it is."""
    if n.op == "call_module":
        mod = gm.get_submodule(str(n.target))
        p = getattr(mod, "p", getattr(mod, "drop_prob", None))
        return isinstance(p, (int, float)) and float(p) == 0.0
    name = _op_name(n)
    if name == "scaled_dot_product_attention":  # random only with attention dropout
        p = n.kwargs.get("dropout_p", n.args[4] if len(n.args) > 4 else 0.0)
        return isinstance(p, (int, float)) and float(p) == 0.0
    if "dropout" not in name and name not in ("drop_path", "stochastic_depth"):
        return False
    p = n.kwargs.get("p", n.kwargs.get("drop_prob", n.args[1] if len(n.args) > 1 else None))
    train = n.kwargs.get("training", n.kwargs.get("train",
                                                  n.args[2] if len(n.args) > 2 else True))
    return isinstance(p, (int, float)) and float(p) == 0.0 or train is False


def seed_random_nodes(gm: fx.GraphModule) -> int:
    """Run every random node of ``gm`` by :func:`per_sample` (a layer with parameters, which
    cannot be moved under a wrapper, is reseeded per chunk); returns how many."""
    count = 0
    for n in list(gm.graph.nodes):
        if not is_random(n, gm) or _never_drops(n, gm):
            continue
        count += 1
        if n.op == "call_module":
            mod = gm.get_submodule(str(n.target))
            if any(True for _ in mod.parameters()):
                with gm.graph.inserting_before(n):
                    gm.graph.call_function(reseed, (n.name,))
                continue
            attr = f"outcore_random_{count}"
            gm.add_submodule(attr, _PerSample(mod, n.name))
            n.target = attr
            continue
        name = _op_name(n)
        writes = name.endswith("_") or n.kwargs.get("inplace") is True or \
            "dropout" in name and len(n.args) > 3 and n.args[3] is True
        if n.op == "call_method":
            key = f"method:{n.target}" + (_IN_PLACE if writes else "")
            _TARGETS.setdefault(key, _method(str(n.target)))
        else:
            qualname = getattr(n.target, "__qualname__", str(n.target))
            key = f"{getattr(n.target, '__module__', '')}.{qualname}" + \
                (_IN_PLACE if writes else "")
            _TARGETS.setdefault(key, n.target)
        with gm.graph.inserting_before(n):
            run = gm.graph.call_function(per_sample, (n.name, key, *n.args), dict(n.kwargs))
        run.meta = dict(n.meta)
        n.replace_all_uses_with(run)
        gm.graph.erase_node(n)
    if count:
        gm.recompile()
    return count
