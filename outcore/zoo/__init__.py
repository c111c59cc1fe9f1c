"""outcore's model zoo (``outcore:<name>``) and the resolver for every model name form."""

from __future__ import annotations

from typing import Any

from outcore.zoo.resolve import ModelSpec, resolve_model, zoo_names

__all__ = ["ModelSpec", "build_model", "resolve_model", "zoo_names"]


def build_model(name: str, *, input_shape: tuple[int, ...] | None = None,
                batch_size: int | None = None, seed: int = 0) -> tuple[ModelSpec, Any]:
    """Resolve a model name and build the model with ``seed``: the planner and every rank
    build the same weights this one way. Returns ``(spec, model)``."""
    import torch

    spec = resolve_model(name, input_shape=input_shape, batch_size=batch_size)
    torch.manual_seed(seed)
    return spec, spec.build()
