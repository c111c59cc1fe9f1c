"""``auto_parallelize``: models built inside the context come out tensor-parallel.

AxoNN's interface (Singh et al., SC 2024; axonn-ai/axonn, ``axonn/intra_layer/``): its context
manager swaps ``torch.nn.Linear`` and ``nn.Embedding`` for AxoNN's own grid-parallel layers
(when the dimensions divide the row x column x depth grid) while the model is built, so each
layer is split alone, without looking at its neighbours. outcore records instead:
while the context is open, every module whose constructor runs is remembered (a wrapper around
``nn.Module.__init__``, the one constructor every module calls); on exit the *roots* among them
(modules not contained in another recorded module) that hold a Linear or an Embedding are handed
to :func:`outcore.parallel.tensor.tensor_parallel`, which sees the whole model and can pair
Megatron-style (one all-reduce per column/row pair instead of a gather per layer). Conversion
happens on exit, not at the first forward, so an optimizer built afterwards holds the split
parameters. Without ``example_inputs`` the graph has no shapes, so only element-wise pairs (MLP
blocks) are found; pass one batch to pair attention projections too.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from torch import nn

from outcore.parallel.tensor.parallel import DEFAULT_MIN_SPLIT_BYTES, tensor_parallel

log = logging.getLogger(__name__)

__all__ = ["auto_parallelize"]


class Built:
    """What the context built: ``models`` (the roots, parallelised on exit)."""

    def __init__(self) -> None:
        self.created: list[nn.Module] = []
        self.models: list[nn.Module] = []


def _roots(created: list[nn.Module]) -> list[nn.Module]:
    inner: set[int] = set()
    for m in created:
        inner.update(id(c) for c in m.modules() if c is not m)
    return [m for m in created if id(m) not in inner and
            any(isinstance(c, (nn.Linear, nn.Embedding)) for c in m.modules())]


@contextlib.contextmanager
def auto_parallelize(tp: int, *, mesh: Any = None, group: Any = None, mode: str = "1d",
                     example_inputs: Any = None,
                     min_split_bytes: int = DEFAULT_MIN_SPLIT_BYTES,
                     grid: tuple[int, int] | None = None) -> Iterator[Built]:
    """Make models built inside tensor-parallel over ``tp`` ranks (arguments as
    :func:`outcore.parallel.tensor.tensor_parallel`). Yields a :class:`Built` listing the models."""
    built = Built()
    original = nn.Module.__init__

    def recording_init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        built.created.append(self)

    nn.Module.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield built
    finally:
        nn.Module.__init__ = original  # type: ignore[method-assign]
    built.models = _roots(built.created)
    built.created = []
    for model in built.models:
        tensor_parallel(model, tp, mesh=mesh, group=group, mode=mode,
                        example_inputs=example_inputs, min_split_bytes=min_split_bytes,
                        grid=grid)
    log.info("auto_parallelize: %d model(s) made tensor-parallel", len(built.models))
