"""The executor's backward call (``boundary.run_backward``) gives what
``torch.autograd.backward`` gives, on its fast path (plain tensors with gradients of their
shape and dtype, straight into the engine) and on the public path it falls back to."""

from __future__ import annotations

import pytest
import torch

from outcore.core import boundary
from outcore.core.boundary import run_backward


def _graph(seed: int):
    torch.manual_seed(seed)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(5, 4, requires_grad=True)
    h = x @ w
    return w, x, [torch.tanh(h), h.sum()]


@pytest.mark.parametrize("fast", [True, False])
def test_gradients_equal_the_public_call(fast, monkeypatch):
    calls = []
    if fast:
        real = boundary._engine_backward
        assert real is not None, "this torch has no engine entry point: the fast path is gone"
        monkeypatch.setattr(boundary, "_engine_backward",
                            lambda *a, **k: calls.append(1) or real(*a, **k))
    w1, x1, roots1 = _graph(0)
    w2, x2, roots2 = _graph(0)
    g = torch.randn(5, 3)
    grads = [g, torch.tensor(2.0)] if fast else [g, None]  # None: the public call fills it in
    run_backward(roots1, grads)
    torch.autograd.backward(roots2, [g, torch.tensor(2.0 if fast else 1.0)])
    assert calls == ([1] if fast else [])
    assert torch.equal(w1.grad, w2.grad) and torch.equal(x1.grad, x2.grad)


def test_a_gradient_of_the_wrong_shape_is_refused():
    _, _, roots = _graph(1)
    with pytest.raises(RuntimeError, match="[Mm]ismatch|shape"):
        run_backward(roots[:1], [torch.randn(3, 5)])
