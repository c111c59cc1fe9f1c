"""The training memory model (docs/design.md, "The memory model"); pure numpy.

On a device during one iteration: for every node placed there, weights + gradients + optimizer
state (``state_factor`` × ``param_bytes``: 4 for Adam in fp32 = weight, gradient, two moments;
3 for SGD with momentum; 2 for plain SGD), plus the saved activations of every micro-batch in
flight between its forward and its backward, plus received boundary tensors, plus the largest
transient working buffer.
"""

from __future__ import annotations

import numpy as np

OPTIMIZER_STATE_FACTOR = {"adam": 4.0, "adamw": 4.0, "sgd": 2.0, "sgd-momentum": 3.0,
                          "momentum": 3.0, "none": 1.0}


def state_factor(optimizer: str) -> float:
    """Copies of the parameters a training step keeps (weights, gradients, optimizer state)."""
    return OPTIMIZER_STATE_FACTOR.get(optimizer.lower(), 4.0)


def static_bytes(param_bytes: np.ndarray, assignment: np.ndarray, devices: int,
                 factor: float = 4.0) -> np.ndarray:
    """Per device: parameters × ``factor`` (weights + grads + optimizer state)."""
    return np.bincount(assignment, weights=param_bytes * factor, minlength=devices)


def activation_bytes(saved_bytes: np.ndarray, assignment: np.ndarray, devices: int) -> np.ndarray:
    """Per device: saved activations of one micro-batch of the graph's batch size."""
    return np.bincount(assignment, weights=saved_bytes, minlength=devices)


def transient_bytes(out_bytes: np.ndarray, assignment: np.ndarray, devices: int) -> np.ndarray:
    """Per device: the largest single node output (working buffer of one op)."""
    peak = np.zeros(devices)
    np.maximum.at(peak, assignment, out_bytes.astype(np.float64))
    return peak
