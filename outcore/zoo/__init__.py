"""outcore's model zoo (``outcore:<name>``) and the resolver for every model name form."""

from __future__ import annotations

import logging
from typing import Any

from outcore.errors import ModelError
from outcore.zoo.resolve import ModelSpec, resolve_model, zoo_names
from outcore.zoo.weightless import weightless

log = logging.getLogger(__name__)

__all__ = ["ModelSpec", "build_model", "built_for_real", "resolve_model", "zoo_names"]


def build_model(name: str, *, input_shape: tuple[int, ...] | None = None,
                batch_size: int | None = None, seed: int = 0,
                weights: bool = True) -> tuple[ModelSpec, Any]:
    """Resolve a model name and build the model with ``seed``: the planner and every rank
    build the same weights this one way. Returns ``(spec, model)``. ``weights=False``: its
    parameters are fake tensors, shapes without memory, for capture and estimated costs
    (:mod:`outcore.zoo.weightless`; a model that cannot be built so is built for real)."""
    import torch

    spec = resolve_model(name, input_shape=input_shape, batch_size=batch_size)
    torch.manual_seed(seed)
    if not weights:
        try:
            return spec, weightless(spec.build)
        except Exception as e:  # the model's code reads a parameter back: build it for real
            log.info("%s cannot be built without its weights (%s: %s); building it whole",
                     name, type(e).__name__, e)
            torch.manual_seed(seed)
    return spec, built_for_real(spec.build, name)


def built_for_real(build: Any, name: str) -> Any:
    """``build()``, refused when its parameters have no storage: a function that hands out a
    model it keeps returns the one built without weights the first time."""
    from torch._subclasses.fake_tensor import is_fake

    net = build()
    if any(p.device.type == "meta" or is_fake(p) for p in net.parameters()):
        raise ModelError(f"{name} gave a model whose parameters have no storage: outcore calls "
                         "the function more than once (once without the weights, to read the "
                         "example); return a new model on each call")
    return net
