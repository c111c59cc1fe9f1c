"""A small MLP with dropout (module and functional) for the placement-independence test."""

import torch
import torch.nn.functional as F
from torch import nn


class DropMLP(nn.Module):
    def __init__(self, p: float = 0.3, inplace: bool = False):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.drop = nn.Dropout(p, inplace=inplace)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)
        self.p, self.inplace = p, inplace

    def forward(self, x):
        # a linear layer's output: no backward reads it, so dropout may also write it
        x = torch.tanh(self.drop(self.a(x)))
        x = F.dropout(self.b(x), self.p, self.training, self.inplace)
        return self.c(x)


def drop_mlp():
    return DropMLP(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


def no_drop_mlp():
    return DropMLP(p=0.0), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


def inplace_drop_mlp():
    """Dropout that writes its input (torchvision's MNASNet and EfficientNet classifiers)."""
    return DropMLP(inplace=True), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


class TensorDropMLP(nn.Module):
    """Megatron pairs big enough to split over 2 ranks (1 MiB each), with dropout between the
    pair's layers (on each rank's shard of the hidden width) and after the pair (whole)."""

    def __init__(self, width: int = 64, hidden: int = 4096, p: float = 0.3):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.head = nn.Linear(width, 4)
        self.p = p

    def forward(self, x):
        h = F.dropout(torch.relu(self.up(x)), self.p, self.training)
        x = x + F.dropout(self.down(h), self.p, self.training)
        return self.head(x)


def tp_drop_mlp():
    return TensorDropMLP(), torch.randn(8, 64, generator=torch.Generator().manual_seed(0))


class AttentionDrop(nn.Module):
    """Self-attention with attention dropout inside ``scaled_dot_product_attention`` (as timm
    and Hugging Face models call it) and a causal mask."""

    def __init__(self, width: int = 32, heads: int = 4, p: float = 0.3):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, 4)
        self.heads, self.p = heads, p

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                           is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c).mean(1))


def attention_drop():
    return AttentionDrop(), torch.randn(8, 6, 32, generator=torch.Generator().manual_seed(0))


class EncoderDrop(nn.Module):
    """``nn.TransformerEncoderLayer`` with its default dropout (0.1, also inside its attention):
    a ``torch.nn`` module, which torch.fx keeps as one leaf."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(width, 4, 2 * width, batch_first=True)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


def encoder_drop():
    return EncoderDrop(), torch.randn(8, 6, 32, generator=torch.Generator().manual_seed(0))
