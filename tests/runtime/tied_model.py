"""A tiny language model whose output layer shares the embedding's weight (weight tying, as in
GPT-2 and BERT), for the shared-parameter tests. Used by name:
tests/runtime/tied_model.py:tied_lm."""

import torch
from torch import nn


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim), nn.Tanh())
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def tied_lm():
    return TiedLM(), torch.randint(0, 32, (8, 6), generator=torch.Generator().manual_seed(0))


def tied_lm_wide():
    """The same with a 4096-word vocabulary of width 64 (a 1 MiB tied weight: its gradients'
    sum shows in a rank's peak)."""
    return TiedLM(vocab=4096, dim=64), torch.randint(0, 4096, (8, 16),
                                                     generator=torch.Generator().manual_seed(0))
