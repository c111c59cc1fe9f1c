"""Mixed precision (``--precision``): the numbers a run computes in, as Lightning users name them.

* ``32``: everything in float32 (the default).
* ``bf16-mixed``: parameters, gradients and optimizer state stay float32 (the master weights);
  each piece's forward and its loss run under :func:`torch.autocast` with bfloat16, so matrix
  work and most activations, and the messages between ranks, are bfloat16.
* ``16-mixed``: the same with float16, whose narrow range needs the loss scaled before the
  backward (:class:`LossScaler`, dynamic, as :class:`torch.amp.GradScaler` does it).

One precision serves the whole pipeline: the graph is captured under it (activation bytes, and
so the memory model and the messages' sizes, follow the dtype autocast gives each layer), the
layers are profiled under it, and every rank runs its pieces under it. Here (layer 1) because
capture, the profiler and the runtime all use it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from outcore.errors import UsageError
from outcore.units import parse_precision

__all__ = ["LossScaler", "autocast", "autocast_dtype", "canonical"]

_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def canonical(name: str | None) -> str:
    """The canonical spelling of a precision (``32``, ``bf16-mixed`` or ``16-mixed``)."""
    return parse_precision(name or "32")


def autocast_dtype(name: str | None) -> torch.dtype | None:
    """The dtype autocast computes in for precision ``name`` (None: float32 throughout)."""
    return _DTYPES[canonical(name)]


def autocast(name: str | None, device: torch.device | str) -> Any:
    """A context manager running its body in precision ``name`` on ``device``'s type (a null
    context for ``32``). Autocast's own weight cache lives as long as the context."""
    dtype = autocast_dtype(name)
    if dtype is None:
        return contextlib.nullcontext()
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=dtype)


class LossScaler:
    """Dynamic loss scaling for ``16-mixed``, the rule :class:`torch.amp.GradScaler` follows:
    the loss is multiplied by ``scale`` before the backward, the gradients divided by it before
    the optimizer step; a step whose gradients hold an infinity or NaN is skipped and halves the
    scale, and ``interval`` good steps in a row double it. Every rank decides from the same
    all-reduced verdict (the runtime's non-finite check), so the scales never diverge."""

    def __init__(self, scale: float = 2.0 ** 16, growth: float = 2.0, backoff: float = 0.5,
                 interval: int = 2000):
        self.scale = float(scale)
        self.growth, self.backoff, self.interval = growth, backoff, interval
        self.good_steps = 0
        self.skipped = 0  # steps skipped for an overflow so far

    def unscale(self, grads: list[torch.Tensor]) -> None:
        """Divide ``grads`` in place by the scale (a power of two: exact)."""
        by_kind: dict[tuple[Any, Any], list[torch.Tensor]] = {}
        for g in grads:
            by_kind.setdefault((g.device, g.dtype), []).append(g)
        inv = 1.0 / self.scale
        for group in by_kind.values():
            torch._foreach_mul_(group, inv)

    def update(self, overflow: bool) -> None:
        """After a step: back off on an overflow, grow after ``interval`` good steps."""
        if overflow:
            self.scale *= self.backoff
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.interval:
            self.scale *= self.growth
            self.good_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scale = float(state["scale"])
        if not (math.isfinite(scale) and scale > 0):
            raise UsageError(f"a checkpoint's loss scale is {scale}: it must be positive")
        self.scale = scale
        self.good_steps = int(state.get("good_steps", 0))
        self.skipped = int(state.get("skipped", 0))
