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
a drop probability of 0 runs as it is.

This does *not* reproduce plain PyTorch's masks (its draws depend on the global order), so
with dropout on, outcore's losses equal across placements but not plain PyTorch's.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import torch
import torch.fx as fx

_context = threading.local()

RANDOM_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                    "feature_alpha_dropout", "feature_dropout", "native_dropout", "drop_path",
                    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like",
                    "randint", "randint_like", "randperm", "normal", "normal_", "uniform_",
                    "multinomial", "exponential_", "random_", "stochastic_depth")


def set_context(seed: int, step: int, chunk: int, samples: int = 0) -> None:
    """The run seed, step and micro-batch chunk the next random nodes draw for, and how many
    samples a chunk holds (0: unknown, a random node's first dimension is taken as them)."""
    _context.key = (int(seed), int(step), int(chunk))
    _context.samples = int(samples)


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

    in_place = target.endswith(_IN_PLACE)

    def rows_of(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() and int(x.shape[0]) == rows:
            if in_place:  # views of the tensor the op writes, sample by sample
                return [x.narrow(0, i * step, step) for i in range(samples)]
            return torch.split(x, step)  # one split, whose backward is one concatenation
        return None

    split_args = [rows_of(a) for a in args]
    split_kwargs = {k: rows_of(v) for k, v in kwargs.items()}
    parts = []
    for i in range(samples):
        reseed(node, chunk * samples + i)
        parts.append(fn(*[a if r is None else r[i] for a, r in zip(args, split_args)],
                        **{k: v if split_kwargs[k] is None else split_kwargs[k][i]
                           for k, v in kwargs.items()}))
    if in_place:  # the tensor written, as the op returns it
        return first
    if isinstance(parts[0], (tuple, list)):  # native_dropout: (output, mask)
        return type(parts[0])(torch.cat([p[k] for p in parts]) for k in range(len(parts[0])))
    return torch.cat(parts)


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
