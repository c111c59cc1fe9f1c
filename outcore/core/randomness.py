"""Random ops that do not depend on placement: dropout seeded per node, step and micro-batch.

Plain PyTorch draws every dropout mask from one global generator, in execution order, so the
masks depend on which ops ran before on the same process: a model split over K ranks would
draw different masks than on one rank, and its losses would differ. outcore reseeds the
generator immediately before every random node (dropout, drop-path, ``bernoulli``, ``rand*``)
from ``(run seed, step, micro-batch chunk, node name)``: the same node sees the same mask on
one rank or K ranks, under any schedule, and again when a checkpointed piece is recomputed.

This does *not* reproduce plain PyTorch's masks (its draws depend on the global order), so
with dropout on, outcore's losses equal across placements but not plain PyTorch's.
"""

from __future__ import annotations

import hashlib
import threading

import torch
import torch.fx as fx

_context = threading.local()

RANDOM_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                    "feature_alpha_dropout", "feature_dropout", "native_dropout", "drop_path",
                    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like",
                    "randint", "randint_like", "randperm", "normal", "normal_", "uniform_",
                    "multinomial", "exponential_", "random_")


def set_context(seed: int, step: int, chunk: int) -> None:
    """The run seed, step and micro-batch chunk the next random nodes draw for."""
    _context.key = (int(seed), int(step), int(chunk))


def reseed(node: str) -> None:
    """Seed the generators random node ``node`` draws from (the CPU's, and the current CUDA
    device's once CUDA is in use) in the current context.

    ``torch.manual_seed`` would seed the same generators to the same value, but it also visits
    every other backend: 57 us a call here against 0.9 us for the CPU generator alone, paid by
    every dropout of every piece on every micro-batch."""
    seed, step, chunk = getattr(_context, "key", (0, 0, 0))
    digest = hashlib.blake2b(f"{seed}/{step}/{chunk}/{node}".encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little") & ((1 << 63) - 1)
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(value)


torch.fx.wrap("reseed")


def is_random(n: fx.Node, gm: torch.nn.Module) -> bool:
    """Whether an fx node may draw random numbers."""
    if n.op == "call_module":
        kind = type(gm.get_submodule(str(n.target))).__name__.lower()
        return "dropout" in kind or "droppath" in kind
    if n.op in ("call_function", "call_method"):
        name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
        return name in RANDOM_FUNCTIONS
    return False


def seed_random_nodes(gm: fx.GraphModule) -> int:
    """Insert ``reseed(name)`` before every random node of ``gm``; returns how many."""
    count = 0
    for n in list(gm.graph.nodes):
        if is_random(n, gm):
            with gm.graph.inserting_before(n):
                gm.graph.call_function(reseed, (n.name,))
            count += 1
    if count:
        gm.recompile()
    return count
