"""Tensor parallelism's collectives timed on the traced step: the communication profile's
``tp allreduce``, ``tp allgather`` and ``tp reduce_scatter`` rows.

DTensor's collectives (modules split with ``parallelize_module``) are functional collectives
(``_c10d_functional``), seen here by a dispatch mode that, on the traced step only, waits for
each one it launches on the tensor-parallel group so its span is launch to completion. The
collectives of an exported graph's split (:mod:`outcore.parallel.tensor.graph_split`) call
:func:`outcore.core.collectives.record` themselves.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from outcore.core.collectives import CollectiveLog, recording

__all__ = ["timed_step"]


# functional collective -> (profile kind, whole bytes from the input's bytes and group size)
_KINDS = {"all_reduce": ("tp allreduce", lambda b, n: b),
          "all_gather_into_tensor": ("tp allgather", lambda b, n: b * n),
          "reduce_scatter_tensor": ("tp reduce_scatter", lambda b, n: b)}


class _FunctionalTimer(TorchDispatchMode):
    def __init__(self, log: CollectiveLog, group_name: str, size: int):
        super().__init__()
        self.log, self.group_name, self.size = log, group_name, size

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__ if func.namespace == "_c10d_functional" else None
        kind = _KINDS.get(name) if name else None
        if kind is None or self.group_name not in args:
            return func(*args, **kwargs)
        x = args[0]
        start = time.perf_counter()
        out = torch.ops._c10d_functional.wait_tensor(func(*args, **kwargs))
        self.log.add(kind[0], kind[1](x.numel() * x.element_size(), self.size), start,
                     time.perf_counter())
        return out


@contextlib.contextmanager
def timed_step(log: CollectiveLog, group: Any) -> Iterator[None]:
    """Within the block (a traced step) the tensor-parallel collectives on ``group`` are
    recorded in ``log``."""
    import torch.distributed as dist

    with recording(log), _FunctionalTimer(log, group.group_name, dist.get_world_size(group)):
        yield
