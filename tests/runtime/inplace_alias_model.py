"""In-place writes into a piece input through an alias of it: an element of a tuple
(``topk``'s values, normalised with ``/=``, as Mixtral's router does) and a view
(``mul_`` on a transposed view of a layer's output). Cut so that ``topk`` and ``fc2`` run on
one rank and the aliasing and writing on another, autograd would refuse to write into the
received leaves."""

import torch
from torch import nn


class WriteThroughAlias(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        w, _ = torch.topk(h, 8, dim=-1)
        w /= w.sum(-1, keepdim=True)
        v = self.fc2(h).view(-1, 2, 4).transpose(1, 2)
        v.mul_(2.0)
        return self.head(w + v.reshape(-1, 8))


def make():
    return WriteThroughAlias(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


class WriteAfterRead(nn.Module):
    """``h`` is read by ``mul`` before ``relu_`` writes it and by ``fc3`` after (timm's
    DropPath writes ``random_tensor.div_(keep_prob)`` and reads it after, likewise); the
    readers may sit in other pieces than the writer."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.fc3 = nn.Linear(32, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        a = self.fc2(h * 2.0)
        h.relu_()
        b = self.fc3(h)
        return self.head(a + b)


def make_write_after_read():
    return WriteAfterRead(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))


class AliasingLayers(nn.Module):
    """Layers that return their input (``nn.Identity``; dropout with p = 0, in the traced and
    the exported graph alike), followed by in-place ReLUs: timm's ResNet writes its identity
    DropBlock's output in place so."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(16, 32)
        self.ident = nn.Identity()
        self.drop = nn.Dropout(0.0)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        u = self.act(self.ident(self.fc1(x)))
        v = torch.relu_(self.drop(self.fc2(x)))
        return self.head(u + v)


def make_aliasing_layers():
    return AliasingLayers(), torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
