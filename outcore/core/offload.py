"""Run-time memory policies: checkpointed forwards, activation and parameter offloading.

* Checkpointing runs a piece's forward under ``torch.utils.checkpoint`` (non-reentrant): only
  its inputs are kept; the backward recomputes the activations. The recomputation runs under
  :func:`frozen_running_stats`, so BatchNorm running statistics are updated once per forward,
  as without checkpointing (a plain ``torch.utils.checkpoint`` updates them twice).
* :class:`ActivationOffloader`: saved-tensor hooks move what autograd saves to pinned host
  memory with non-blocking copies on a side stream, and bring it back — prefetched on the side
  stream when the executor announces the backward — before the backward needs it. When the
  device is the host (CPU) the hooks keep tensors where they are: nothing moves, nothing is
  freed, and the memory tracker sees exactly that.
* :class:`ParamOffloader`: a piece's parameters live in pinned host memory and are copied to
  the device just before its forward or backward, and gradients are accumulated on the host,
  where the optimizer steps. A no-op on CPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def running_stats(module: torch.nn.Module, attrs: tuple[str, ...] = RUNNING_STATS
                  ) -> dict[str, torch.Tensor]:
    """The running-statistics buffers (``attrs``) of ``module``'s batch-norm layers that track
    them, by qualified name; buffers this rank did not materialize (meta) are left out."""
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for attr in attrs:
                buf = getattr(m, attr, None)
                if isinstance(buf, torch.Tensor) and buf.device.type != "meta":
                    out[f"{name}.{attr}" if name else attr] = buf
    return out


@contextmanager
def frozen_running_stats(module: torch.nn.Module) -> Iterator[None]:
    """Within this context, the running statistics of ``module``'s batch-norm layers do not
    change: they are restored on exit (used around a checkpointed piece's recomputation,
    which must not count the same batch twice)."""
    saved = [(buf, buf.clone()) for buf in running_stats(module).values()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


class ActivationOffloader:
    """Offloads saved activations per (piece, micro-batch) and prefetches them back."""

    def __init__(self, device: torch.device):
        self.device = device
        self.active = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.active else None
        self.stored: dict[tuple[int, int], list[Any]] = {}

    @contextmanager
    def saving(self, piece: int, mb: int) -> Iterator[None]:
        """Within this context, tensors autograd saves are offloaded for ``(piece, mb)``."""
        if not self.active:
            yield
            return
        slots = self.stored.setdefault((piece, mb), [])

        def pack(t: torch.Tensor) -> Any:
            if t.device.type != "cuda" or t.numel() < 1024:
                return t
            host = torch.empty(t.shape, dtype=t.dtype, layout=t.layout, pin_memory=True)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host.copy_(t, non_blocking=True)
                t.record_stream(self.stream)
            slot = {"host": host, "device": None, "event": torch.cuda.Event()}
            slot["event"].record(self.stream)
            slots.append(slot)
            return slot

        def unpack(x: Any) -> torch.Tensor:
            if isinstance(x, torch.Tensor):
                return x
            if x["device"] is None:
                self._fetch(x)
            torch.cuda.current_stream(self.device).wait_event(x["event"])
            return x["device"]

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def _fetch(self, slot: dict[str, Any]) -> None:
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(slot["event"])
            slot["device"] = slot["host"].to(self.device, non_blocking=True)
            slot["event"] = torch.cuda.Event()
            slot["event"].record(self.stream)

    def prefetch(self, piece: int, mb: int) -> None:
        """Start copying ``(piece, mb)``'s activations back to the device (side stream)."""
        for slot in self.stored.get((piece, mb), []):
            if slot["device"] is None:
                self._fetch(slot)

    def release(self, piece: int, mb: int) -> None:
        self.stored.pop((piece, mb), None)


class ParamOffloader:
    """Keeps some parameters on the host; the executor brings them in around each use."""

    def __init__(self, device: torch.device, params: list[torch.nn.Parameter]):
        self.device = device
        self.active = device.type == "cuda" and bool(params)
        self.params = params
        self.host: dict[int, torch.Tensor] = {}
        self.host_grad: dict[int, torch.Tensor] = {}
        if self.active:
            for p in params:
                self.host[id(p)] = p.detach().to("cpu").pin_memory()
                p.data = self.host[id(p)]

    @contextmanager
    def resident(self, params: list[torch.nn.Parameter]) -> Iterator[None]:
        """Parameters on the device inside the context; gradients to the host after it."""
        if not self.active:
            yield
            return
        mine = [p for p in params if id(p) in self.host]
        for p in mine:
            p.data = self.host[id(p)].to(self.device, non_blocking=True)
        try:
            yield
        finally:
            for p in mine:
                if p.grad is not None and p.grad.device.type == "cuda":
                    g = p.grad.to("cpu")
                    acc = self.host_grad.get(id(p))
                    self.host_grad[id(p)] = g if acc is None else acc + g
                    p.grad = None
                p.data = self.host[id(p)]

    def before_step(self) -> None:
        """Hand the host-accumulated gradients to the optimizer (which steps on the host)."""
        if not self.active:
            return
        for p in self.params:
            g = self.host_grad.pop(id(p), None)
            if g is not None:
                p.grad = g
