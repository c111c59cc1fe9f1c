"""Small hand-made graphs for the drawing tests (no torch)."""

from __future__ import annotations

import numpy as np

from outcore.graph.ir import Graph, build


def diamond() -> Graph:
    """x -> a -> {b1 -> b2, c} -> add -> out, plus a long skip a -> out."""
    names = ["x", "a", "b1", "b2", "c", "add", "out"]
    src = [0, 1, 2, 1, 3, 4, 5, 1]
    dst = [1, 2, 3, 4, 5, 5, 6, 6]
    ops = ["input", "linear", "linear", "relu", "linear", "add", "output"]
    return build("diamond", fwd_s=[0, 1e-3, 2e-3, 1e-4, 3e-3, 1e-4, 0], src=src, dst=dst,
                 edge_bytes=[1024] * len(src), names=names, ops=ops)


def blocks(num_blocks: int = 6, per_block: int = 8) -> Graph:
    """A chain of residual blocks with module paths ``stage{s}.block{b}.layer{j}``."""
    names, modules, src, dst = ["x"], [""], [], []
    prev = 0
    for b in range(num_blocks):
        start = prev
        for j in range(per_block):
            idx = len(names)
            names.append(f"stage{b // 3}_block{b}_layer{j}")
            modules.append(f"stage{b // 3}.block{b}.layer{j}")
            src.append(prev)
            dst.append(idx)
            prev = idx
        src.append(start)  # skip connection around the block
        dst.append(prev)
    n = len(names)
    return build("blocks", fwd_s=np.full(n, 1e-4), src=src, dst=dst, names=names,
                 modules=modules, ops=["input"] + ["conv2d"] * (n - 1))


def synthetic(n: int, width: int = 30, seed: int = 0) -> Graph:
    """A random DAG without module paths: each node reads one or two of the previous ``width``."""
    rng = np.random.default_rng(seed)
    v = np.arange(1, n)
    first = v - 1 - rng.integers(0, np.minimum(v, width))
    second = v - 1 - rng.integers(0, np.minimum(v, width))
    extra = rng.random(n - 1) < 0.3
    src = np.concatenate([first, second[extra & (second != first)]])
    dst = np.concatenate([v, v[extra & (second != first)]])
    return build("synthetic", fwd_s=rng.lognormal(-9, 1, n), src=src, dst=dst,
                 edge_bytes=rng.integers(1_000, 1_000_000, src.size), check=False)
