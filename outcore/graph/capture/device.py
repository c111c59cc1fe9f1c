"""A captured graph that runs on whatever device its module is on.

``torch.export`` records the device of capture in the graph: ``aten.arange(16, device=cpu)``
for GPT-2's position ids, ``inv_freq.to(cpu)`` in Llama's rotary embedding, masks made with
``device=cpu``; and lifted tensor constants are plain attributes, which ``module.to(device)``
does not move. A graph captured on the CPU then fails on a GPU ("Expected all tensors to be on
the same device"). :func:`follow_module_device` makes such calls take their device from the
module at run time (a buffer of the module, :data:`ANCHOR`, which moves with it), and registers
the constants as buffers, so one capture is profiled and trained on any device. Node names,
targets' op names and the graph's structure stay as captured.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.fx as fx
from torch import nn

__all__ = ["ANCHOR", "OnModuleDevice", "follow_module_device"]

ANCHOR = "_outcore_device"  # an empty buffer of the traced module: where its module is


class OnModuleDevice:
    """``op`` with its device argument (keyword, or positional at ``position``) replaced, at
    each call, by the device of ``module``'s :data:`ANCHOR` buffer."""

    def __init__(self, op: Any, module: nn.Module, position: int | None):
        self.op = op
        self._module = weakref.ref(module)
        self.position = position
        packet = getattr(op, "overloadpacket", None)
        self.__name__ = packet.__name__ if packet is not None else getattr(op, "__name__", "op")
        self.__qualname__ = self.__name__

    def device(self) -> torch.device | None:
        module = self._module()
        anchor = getattr(module, ANCHOR, None) if module is not None else None
        return anchor.device if isinstance(anchor, torch.Tensor) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dev = self.device()
        if dev is not None and dev.type != "meta":
            if self.position is None:
                kwargs["device"] = dev
            else:
                args = args[:self.position] + (dev,) + args[self.position + 1:]
        return self.op(*args, **kwargs)

    def __str__(self) -> str:  # what string matches on a node's target see: the op's name
        return str(self.op)

    def __repr__(self) -> str:
        return f"{self.op} (on its module's device)"


def follow_module_device(gm: fx.GraphModule) -> None:
    """Make ``gm``'s calls with a fixed device follow ``gm``'s device, and its plain tensor
    constants buffers (see the module docstring). Call it before ``gm.recompile()``."""
    first = next((t for t in (*gm.parameters(), *gm.buffers()) if t.device.type != "meta"),
                 None)
    if not hasattr(gm, ANCHOR):
        gm.register_buffer(ANCHOR, torch.empty(0, device=first.device if first is not None
                                                else "cpu"), persistent=False)
    _constants_as_buffers(gm)
    for n in gm.graph.nodes:
        if n.op != "call_function" or isinstance(n.target, OnModuleDevice):
            continue
        position = None
        if isinstance(n.kwargs.get("device"), torch.device):
            found = True
        else:
            position = next((k for k, a in enumerate(n.args) if isinstance(a, torch.device)),
                            None)
            found = position is not None
        if found:
            n.target = OnModuleDevice(n.target, gm, position)


def _constants_as_buffers(gm: fx.GraphModule) -> None:
    """Register every plain tensor a ``get_attr`` node reads as a (non-persistent) buffer of
    its owner module, so that it moves with the module."""
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        owner, _, attr = str(n.target).rpartition(".")
        try:
            mod = gm.get_submodule(owner) if owner else gm
        except AttributeError:
            continue
        value = getattr(mod, attr, None)
        if type(value) is torch.Tensor and attr not in mod._buffers:
            delattr(mod, attr)
            mod.register_buffer(attr, value, persistent=False)
