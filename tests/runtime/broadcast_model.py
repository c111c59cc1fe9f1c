"""A model whose memory peak is the backward of a product of two broadcast inputs (Mamba's
``A[None, :, None, :] * dt[:, :, :, None]``): both inputs' gradients are made at the
product's size before they are summed down to the inputs' shapes."""

import torch
from torch import nn


class Outer(nn.Module):
    def __init__(self, width: int = 64, state: int = 16):
        super().__init__()
        self.proj = nn.Linear(state, width)
        self.a = nn.Parameter(torch.randn(1, width, 1, state) * 0.1)
        self.out = nn.Linear(state, 1)

    def forward(self, x):  # x: [b, l, state]
        dt = self.proj(x).transpose(1, 2).unsqueeze(-1)  # [b, width, l, 1]
        return self.out(self.a * dt).mean((1, 3))  # the product: [b, width, l, state]


def outer():
    return Outer(), torch.randn(8, 32, 16)


class Table(nn.Module):
    """Gemma 4's vision position embeddings: a one-hot of each token's (x, y) position, of
    shape ``[b, 2, l, size]``, times a table of ``[2, size, width]``. The batched product
    copies the table once per sample, and its backward makes the table's gradient at that size
    before summing it down."""

    def __init__(self, size: int = 2048, width: int = 64):
        super().__init__()
        self.size = size
        self.table = nn.Parameter(torch.randn(2, size, width) * 0.02)
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x):  # x: [b, l, width]
        b, length, _ = x.shape
        pos = torch.arange(length, device=x.device) % self.size
        one_hot = nn.functional.one_hot(torch.stack([pos, pos.flip(0)]), self.size)
        one_hot = one_hot[None].expand(b, -1, -1, -1).to(x.dtype)  # [b, 2, l, size]
        return self.out(self.proj(x) + (one_hot @ self.table).sum(1)).mean(1)


def table():
    return Table(), torch.randn(8, 16, 64)


class Widening(nn.Module):
    """A block torch.fx cannot trace (it branches on a value): one leaf node whose forward and
    backward hold tensors 512 times its output's size inside."""

    def __init__(self, width: int = 64, wide: int = 512):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(wide) * 0.1)

    def forward(self, h):  # h: [b, width]
        big = h[:, :, None] * self.scale  # [b, width, wide]
        if big.sum() > -1e30:
            big = torch.tanh(big)
        return big.mean(-1)


class WithLeaf(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.block = Widening(width)
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        return self.out(self.block(self.inp(x)))


def leaf():
    return WithLeaf(), torch.randn(64, 16)


class BiasedAttention(nn.Module):
    """Attention with a learned position bias as its mask (timm's TinyViT, Swin): the CPU
    runs the math path, which holds the scores and their softmax in full."""

    def __init__(self, width: int = 64, heads: int = 4, length: int = 64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.bias = nn.Parameter(torch.zeros(heads, length, length))
        self.out = nn.Linear(width, 1)

    def forward(self, x):  # x: [b, length, width]
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
        return self.out(y.transpose(1, 2).reshape(b, n, w)).mean(1)


def biased_attention():
    return BiasedAttention(), torch.randn(16, 64, 64)
