"""Training data for the runtime: seeded synthetic batches, or an ImageFolder.

Every batch is a pure function of ``(seed, step)``, so every rank that needs the inputs or the
targets of a step produces the same ones without communication, a resumed run sees the same
data as an uninterrupted one, and single-process training sees exactly the same batches.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

from outcore.errors import UsageError
from outcore.runtime.values import LeafMeta, ValueMeta

Batch = tuple[tuple[torch.Tensor, ...], Any]


class DataSource(Protocol):
    batch_size: int

    def batch(self, step: int) -> Batch:
        """(inputs, targets) of the global batch of ``step``."""


class SyntheticData:
    """Inputs shaped like the example inputs; targets shaped like the model's output.

    Float inputs are standard normal; integer inputs (token ids) uniform below their bound.
    Targets: a class index per row for ``(B, C)`` outputs, per position for ``(B, T, V)``; a
    normal tensor for other float outputs (then the default loss is MSE).
    """

    def __init__(self, example_inputs: tuple[torch.Tensor, ...], int_high: tuple[int | None, ...],
                 output_meta: ValueMeta, batch_size: int, seed: int):
        self.example_inputs = example_inputs
        self.int_high = int_high
        self.output_meta = output_meta
        self.batch_size = batch_size
        self.seed = seed

    def batch(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        inputs = []
        for k, x in enumerate(self.example_inputs):
            shape = (self.batch_size, *x.shape[1:])
            if x.is_floating_point():
                inputs.append(torch.randn(shape, generator=gen, dtype=x.dtype))
            else:
                high = (self.int_high[k] if k < len(self.int_high) and self.int_high[k] else 2)
                inputs.append(torch.randint(0, high, shape, generator=gen, dtype=x.dtype))
        targets = [self._target(m, gen) if isinstance(m, LeafMeta) else m
                   for m in self.output_meta.leaves]
        return tuple(inputs), tree_unflatten(targets, self.output_meta.spec)

    def _target(self, m: LeafMeta, gen: torch.Generator) -> torch.Tensor:
        shape = (self.batch_size, *m.shape[1:])
        if m.dtype.is_floating_point and len(shape) >= 2 and m.requires_grad:
            return torch.randint(0, shape[-1], shape[:-1], generator=gen)
        return torch.randn(shape, generator=gen)


class ImageFolderData:
    """Batches from a torchvision ``ImageFolder`` (resized to the example input's size),
    shuffled with a seeded permutation per epoch."""

    def __init__(self, root: str, example_input: torch.Tensor, batch_size: int, seed: int):
        import torchvision
        from torchvision import transforms

        size = tuple(example_input.shape[-2:])
        try:
            self.ds = torchvision.datasets.ImageFolder(
                root, transform=transforms.Compose([transforms.Resize(size),
                                                    transforms.CenterCrop(size),
                                                    transforms.ToTensor()]))
        except (FileNotFoundError, OSError) as e:
            raise UsageError(f"cannot read image folder {root!r}: {e}; expected one "
                             "sub-folder of images per class") from None
        if len(self.ds) < batch_size:
            raise UsageError(f"image folder {root!r} has {len(self.ds)} images, fewer than the "
                             f"batch size {batch_size}")
        self.batch_size = batch_size
        self.seed = seed
        self.per_epoch = len(self.ds) // batch_size

    def batch(self, step: int) -> Batch:
        epoch, k = divmod(step, self.per_epoch)
        perm = torch.randperm(len(self.ds), generator=torch.Generator().manual_seed(
            self.seed * 7919 + epoch))
        idx = perm[k * self.batch_size:(k + 1) * self.batch_size].tolist()
        items = [self.ds[i] for i in idx]
        return (torch.stack([x for x, _ in items]),), torch.tensor([y for _, y in items])


def split(value: Any, parts: int) -> list[Any]:
    """Split every tensor leaf of ``value`` into ``parts`` equal chunks along dim 0."""
    leaves, spec = tree_flatten(value)
    chunks = []
    for x in leaves:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            if x.shape[0] % parts:
                raise UsageError(f"a batch of {x.shape[0]} cannot be split into {parts} equal "
                                 "micro-batches: make the batch size a multiple of "
                                 "--microbatches")
            chunks.append(list(torch.chunk(x, parts)))
        else:
            chunks.append([x] * parts)
    return [tree_unflatten([c[i] for c in chunks], spec) for i in range(parts)]


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """Cross-entropy for integer targets (over the last dimension), MSE for float targets;
    summed over the leaves of tuple outputs."""
    outs, _ = tree_flatten(output)
    tgts, _ = tree_flatten(target)
    total = None
    for o, t in zip(outs, tgts):
        if not isinstance(o, torch.Tensor) or not o.is_floating_point():
            continue
        if isinstance(t, torch.Tensor) and not t.is_floating_point():
            loss = F.cross_entropy(o.reshape(-1, o.shape[-1]), t.reshape(-1))
        else:
            loss = F.mse_loss(o, t)
        total = loss if total is None else total + loss
    if total is None:
        raise UsageError("the model output has no floating-point tensor to take a loss of")
    return total


LossFn = Callable[[Any, Any], torch.Tensor]
