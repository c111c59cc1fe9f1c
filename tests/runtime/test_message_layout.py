"""Packed messages: several small tensors travel as one byte buffer and come back
bit-identical, of every dtype and shape, with no memory shared between the unpacked tensors'
autograd histories."""

from __future__ import annotations

import torch

from outcore.core.comm import PACK_MAX_BYTES, _Layout
from outcore.core.values import LeafMeta


def _meta(t: torch.Tensor, requires_grad: bool = False) -> LeafMeta:
    return LeafMeta(tuple(t.shape), t.dtype, requires_grad)


def test_pack_round_trip_keeps_every_dtype_and_shape_bit_exact():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=g), torch.randint(-9, 9, (7,), generator=g),
               torch.rand(2, 3, generator=g) > 0.5, torch.randn(0, 4, generator=g),
               torch.randn(1, dtype=torch.float64, generator=g),
               torch.randn(2, 2, generator=g).to(torch.bfloat16),
               torch.randn(3, generator=g, dtype=torch.complex64)]
    lay = _Layout([_meta(t) for t in tensors])
    assert lay.packed
    assert all(off % 16 == 0 for off in lay.offsets)
    wire = [t.to(torch.uint8) if t.dtype == torch.bool else t for t in tensors]
    out = lay.unpack(lay.pack(wire, torch.device("cpu")))
    for a, b in zip(tensors, out):
        b = b.to(torch.bool) if a.dtype == torch.bool else b
        assert b.dtype == a.dtype and b.shape == a.shape
        assert torch.equal(a.view(-1).view(torch.uint8) if a.dtype != torch.bool else a,
                           b.view(-1).view(torch.uint8) if b.dtype != torch.bool else b)


def test_unpacked_tensors_are_separate_autograd_leaves():
    lay = _Layout([LeafMeta((2, 2), torch.float32, True), LeafMeta((3,), torch.float32, True)])
    out = lay.unpack(lay.pack([torch.ones(2, 2), torch.full((3,), 2.0)], torch.device("cpu")))
    for x in out:
        x.requires_grad_(True)
    (out[0].sum() * 3 + out[1].sum()).backward()
    assert torch.equal(out[0].grad, torch.full((2, 2), 3.0))
    assert torch.equal(out[1].grad, torch.ones(3))


def test_single_and_large_messages_are_not_packed():
    assert not _Layout([LeafMeta((4,), torch.float32, False)]).packed
    n = PACK_MAX_BYTES // 4
    big = _Layout([LeafMeta((n,), torch.float32, False), LeafMeta((1,), torch.float32, False)])
    assert not big.packed
    assert len(big.empty(torch.device("cpu"))) == 2
