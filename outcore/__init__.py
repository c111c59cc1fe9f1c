"""outcore: train deep networks too large for one device, across many, automatically."""

__version__ = "0.1.0"
