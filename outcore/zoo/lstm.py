"""A stacked-LSTM language model (Zaremba et al., "Recurrent Neural Network Regularization",
2014, section 3), the RNN family of the ParDNN paper's evaluation.

``unroll=False`` keeps one ``nn.LSTM`` per layer (a chain of layers); ``unroll=True`` unrolls
every layer into ``LSTMCell`` steps, which gives the layers × time grid graph whose wavefront
parallelism graph partitioners exploit.
"""

from __future__ import annotations

import torch
from torch import nn


class LSTMLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, seq: int, unroll: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.unroll = unroll
        self.seq = seq
        if unroll:
            self.cells = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        else:
            self.layers = nn.ModuleList(nn.LSTM(hidden, hidden, batch_first=True)
                                        for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if not self.unroll:
            for lstm in self.layers:
                x, _ = lstm(x)
            return self.head(x)
        steps = [x[:, t] for t in range(self.seq)]
        for cell in self.cells:
            h = c = torch.zeros_like(steps[0])
            outs = []
            for t in range(self.seq):
                h, c = cell(steps[t], (h, c))
                outs.append(h)
            steps = outs
        return self.head(torch.stack(steps, dim=1))


def lstm_lm(layers: int = 2, hidden: int = 64, vocab: int = 256, seq: int = 16,
            unroll: bool = False) -> nn.Module:
    """Stacked-LSTM LM over ``seq`` tokens (``unroll=True``: a layers × seq cell grid)."""
    return LSTMLM(vocab, hidden, layers, seq, unroll)
