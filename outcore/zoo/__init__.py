"""outcore's model zoo (``outcore:<name>``) and the resolver for every model name form."""

from outcore.zoo.resolve import ModelSpec, resolve_model, zoo_names

__all__ = ["ModelSpec", "resolve_model", "zoo_names"]
