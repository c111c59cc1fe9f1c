"""Reseeding a random node draws what ``torch.manual_seed`` with the same value would (the masks
did not change when reseeding stopped visiting every backend), and differs per node, step and
micro-batch chunk."""

from __future__ import annotations

import hashlib

import torch

from outcore.core.randomness import reseed, set_context


def _draw(seed: int, step: int, chunk: int, node: str) -> torch.Tensor:
    set_context(seed, step, chunk)
    reseed(node)
    return torch.rand(8)


def test_reseed_draws_as_torch_manual_seed_would():
    digest = hashlib.blake2b(b"7/3/1/layers.0.dropout", digest_size=8).digest()
    torch.manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    expected = torch.rand(8)
    assert torch.equal(_draw(7, 3, 1, "layers.0.dropout"), expected)
    assert torch.equal(_draw(7, 3, 1, "layers.0.dropout"), expected)  # again: the same mask
    for other in ((7, 4, 1, "layers.0.dropout"), (7, 3, 2, "layers.0.dropout"),
                  (7, 3, 1, "layers.1.dropout"), (8, 3, 1, "layers.0.dropout")):
        assert not torch.equal(_draw(*other), expected)
