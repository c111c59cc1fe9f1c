"""Reseeding a random node draws what ``torch.manual_seed`` with the same value would (the masks
did not change when reseeding stopped visiting every backend), and differs per node, step and
micro-batch chunk; a random node draws per sample, however the batch is grouped."""

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


def _dropout_in_chunks(x: torch.Tensor, chunks: int, samples_known: bool) -> torch.Tensor:
    """Dropout of ``x`` (samples x tokens rows, sample-major) run chunk by chunk as the
    executor runs it."""
    import torch.nn.functional as F

    from outcore.core.randomness import _TARGETS, per_sample

    _TARGETS["test.dropout"] = F.dropout
    per_chunk = x.shape[0] // chunks
    out = []
    for c, part in enumerate(torch.split(x, per_chunk)):
        set_context(5, 1, c, per_chunk // 3 if samples_known else 0)
        out.append(per_sample("drop", "test.dropout", part, 0.5, True))
    return torch.cat(out)


def test_a_sample_draws_the_same_mask_however_the_batch_is_grouped():
    """4 samples of 3 tokens each, flattened to 12 rows: one chunk, 2 or 4 chunks draw the
    same mask for every sample; a node whose rows are not the samples' still draws."""
    x = torch.ones(12, 5)
    whole = _dropout_in_chunks(x, 1, True)
    assert 0 < int((whole == 0).sum()) < whole.numel()
    for chunks in (2, 4):
        assert torch.equal(_dropout_in_chunks(x, chunks, True), whole)
    # told nothing of the samples, a chunk takes its rows as samples: consistent per chunk only
    assert torch.equal(_dropout_in_chunks(x, 4, False), _dropout_in_chunks(x, 4, False))
    set_context(5, 1, 0, 5)  # 12 rows are not whole samples of 5: drawn for the chunk
    from outcore.core.randomness import per_sample
    assert per_sample("drop", "test.dropout", x, 0.5, True).shape == x.shape
