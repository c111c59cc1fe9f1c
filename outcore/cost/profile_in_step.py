"""Per-node forward and backward times measured inside whole training steps (host devices).

Timing each node alone (:func:`outcore.cost.profile.time_node`) repeats it on warm caches and
pays what only a lone call pays: a residual add's backward alone makes both input gradients
(10-28 us on the zoo ResNet at 2 samples), inside a step autograd hands the gradient on (2 us);
the classifier's pooling and linear layer after a wide activation run 3x their lone time. The
step total is right (the profiler scales each pass to a timed step), but the share of each node
is not, and a pipeline's pieces inherit the error: on the zoo ResNet the last sixth of the
nodes summed 0.85x of what a step spends in them, the first sixth's backward 1.2x.

Here a copy of the traced module reads the clock after every node's forward, and a gradient
hook on each node's output reads it when autograd starts that node's backward; a node's time is
the gap to the next reading, less the readings' own cost (timed on a chain of readings with no
work between). CPU autograd runs every backward function on the calling thread, in order, so
the gaps are the nodes' times. On CUDA kernels run asynchronously, and the lone timing (with a
synchronisation around each call) stays.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

# timed steps: ``repeat`` at least; more, up to STEPS, while they take under BUDGET_S together
# (a small model's step is cheaper than timing two of its nodes alone; a large one's is not;
# a median of 3 steps was 19 % high once on a loaded machine: the zoo AmoebaNet at 2 samples)
STEPS, BUDGET_S = 10, 0.25

_clock = time.perf_counter
_forward: list[tuple[float, int]] = []
_backward: list[tuple[float, int]] = []


class _Hook:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __call__(self, grad: torch.Tensor) -> None:
        _backward.append((_clock(), self.i))


def _stamp(x: Any, i: int) -> Any:
    """The clock after node ``i``'s forward, and a hook on its output for its backward."""
    _forward.append((_clock(), i))
    if isinstance(x, torch.Tensor) and x.requires_grad:
        x.register_hook(_Hook(i))
    return x


def _start() -> None:
    _forward.append((_clock(), -1))


def affordable(repeat: int, run_s: float) -> int:
    """Timed runs of ``run_s`` seconds each: ``repeat`` at least, more (up to ``STEPS``) while
    they take under ``BUDGET_S`` together (medians of more runs ride out a loaded moment)."""
    return min(max(repeat, int(BUDGET_S / max(run_s, 1e-9))), max(repeat, STEPS))


def _instrumented(gm: fx.GraphModule, names: list[str]) -> fx.GraphModule:
    """A copy of ``gm`` (sharing its parameters) that stamps every node in ``names``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    index = {name: i for i, name in enumerate(names)}
    started = False
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "get_attr") and not started:
            graph.call_function(_start, ())
            started = True
        new = graph.node_copy(n, lambda a: env[a])
        if n.name in index and n.op in ("call_module", "call_function", "call_method"):
            new = graph.call_function(_stamp, (new, index[n.name]))
        env[n] = new
    return fx.GraphModule(gm, graph)


def _stamp_costs(rounds: int = 20, chain: int = 200) -> tuple[float, float]:
    """Seconds one stamp adds to a forward and one hook to a backward (medians)."""
    f, b = [], []
    for _ in range(rounds):
        x = torch.zeros(4, requires_grad=True) * 1.0
        _forward.clear()
        _backward.clear()
        t0 = _clock()
        for i in range(chain):
            x = _stamp(x, i)
        t1 = _clock()
        x.sum().backward()
        t2 = _clock()
        f.append((t1 - t0) / chain)
        b.append((t2 - t1) / chain)
    return statistics.median(f), statistics.median(b)


def step_loss(out: Any) -> torch.Tensor:
    """The profiler's stand-in loss: the mean square of every floating-point output."""
    leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.float().pow(2).mean() for t in leaves)  # type: ignore[return-value]


def time_nodes_in_step(gm: fx.GraphModule, names: list[str], inputs: tuple[Any, ...],
                       warmup: int, repeat: int,
                       progress: Callable[[int, int], None] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` seconds of each node in ``names`` (fx node names of ``gm``),
    medians over ``repeat`` or more (``STEPS``, ``BUDGET_S``) training steps of ``gm`` on
    ``inputs`` after ``warmup`` (at least one). A node autograd does not differentiate gets no
    backward. ``progress(done, len(names))`` after each step."""
    run = _instrumented(gm, names)
    cost_f, cost_b = _stamp_costs()
    n = len(names)
    fwd_runs, bwd_runs = [], []
    warmup, steps = max(warmup, 1), max(warmup, 1) + max(repeat, 1)
    try:
        k = 0
        while k < steps:
            if progress:
                progress(n * k // steps, n)
            _forward.clear()
            _backward.clear()
            started = _clock()
            loss = step_loss(run(*inputs))
            end_forward = len(_forward)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                loss.backward()
            finished = _clock()
            gm.zero_grad(set_to_none=True)
            k += 1
            if k == warmup:
                steps = warmup + affordable(repeat, finished - started)
            if k <= warmup:
                continue
            f = np.zeros(n)
            stamps = _forward[:end_forward]
            for (t0, _), (t1, i) in zip(stamps, stamps[1:]):
                f[i] += t1 - t0 - cost_f
            b = np.zeros(n)
            for (t0, i), (t1, _) in zip(_backward, _backward[1:] + [(finished, -1)]):
                b[i] += t1 - t0 - cost_b
            fwd_runs.append(f)
            bwd_runs.append(b)
    finally:
        _forward.clear()
        _backward.clear()
    if progress:
        progress(n, n)
    fwd = np.maximum(np.median(np.stack(fwd_runs), axis=0), 0.0)
    bwd = np.maximum(np.median(np.stack(bwd_runs), axis=0), 0.0)
    return fwd, bwd
