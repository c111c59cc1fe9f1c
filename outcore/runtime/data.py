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

from outcore.core.values import LeafMeta, ValueMeta
from outcore.errors import UsageError

Batch = tuple[tuple[torch.Tensor, ...], Any]


class DataSource(Protocol):
    batch_size: int

    def batch(self, step: int) -> Batch:
        """(inputs, targets) of the global batch of ``step``."""


class SyntheticData:
    """Inputs shaped like the example inputs; targets shaped like the model's output.

    Float inputs are standard normal; integer inputs (token ids) uniform below their bound.
    Targets follow ``task`` when given (see :func:`task_targets`: a causal LM learns its input
    shifted by one, a masked LM the tokens it cannot see); otherwise a class index per row for
    ``(B, C)`` outputs, per position for ``(B, T, V)``; a normal tensor for other float outputs
    (then the default loss is MSE).
    """

    def __init__(self, example_inputs: tuple[torch.Tensor, ...], int_high: tuple[int | None, ...],
                 output_meta: ValueMeta, batch_size: int, seed: int, task: str | None = None,
                 task_options: dict[str, Any] | None = None):
        self.example_inputs = example_inputs
        self.int_high = int_high
        self.output_meta = output_meta
        self.batch_size = batch_size
        self.seed = seed
        self.task = task
        self.task_options = task_options or {}

    def batch(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        inputs = []
        for k, x in enumerate(self.example_inputs):
            shape = (self.batch_size, *x.shape[1:])
            if x.is_floating_point():
                inputs.append(torch.randn(shape, generator=gen, dtype=x.dtype))
            else:
                high = (self.int_high[k] if k < len(self.int_high) and self.int_high[k] else 2)
                inputs.append(torch.randint(0, high, shape, generator=gen, dtype=x.dtype)
                              if high > 1 else torch.ones(shape, dtype=x.dtype))
        if self.task in TOKEN_TASKS:
            return task_targets(self.task, tuple(inputs), gen, **self.task_options)
        targets = [self._target(m, gen) if isinstance(m, LeafMeta) else m
                   for m in self.output_meta.leaves]
        return tuple(inputs), tree_unflatten(targets, self.output_meta.spec)

    def _target(self, m: LeafMeta, gen: torch.Generator) -> torch.Tensor:
        shape = (self.batch_size, *m.shape[1:])
        if self.task == "regression":
            return torch.randn(shape, generator=gen)
        if self.task == "classification" or m.dtype.is_floating_point and len(shape) >= 2 \
                and m.requires_grad:
            return torch.randint(0, shape[-1], shape[:-1], generator=gen)
        return torch.randn(shape, generator=gen)


TOKEN_TASKS = ("causal_lm", "masked_lm", "seq2seq_lm")
IGNORE = -100  # cross-entropy's ignore_index: positions without a target


def task_targets(task: str, inputs: tuple[torch.Tensor, ...], gen: torch.Generator,
                 mask_token_id: int = 0, mask_prob: float = 0.15) -> Batch:
    """(inputs, targets) of a token task, from the token inputs of a batch.

    ``causal_lm``: target at position t is token t+1 (the last position has none);
    ``seq2seq_lm``: the same on the decoder input (the third input: ids, mask, decoder ids);
    ``masked_lm`` (BERT): a seeded ``mask_prob`` of the positions (at least one per row) are
    replaced by ``mask_token_id`` in the input, and only they have targets (the original ids).
    Positions without a target hold -100, which cross-entropy ignores.
    """
    ids = inputs[2] if task == "seq2seq_lm" else inputs[0]
    if task in ("causal_lm", "seq2seq_lm"):
        targets = torch.full_like(ids, IGNORE)
        targets[:, :-1] = ids[:, 1:]
        return inputs, targets
    masked = torch.rand(ids.shape, generator=gen) < mask_prob
    first = torch.randint(0, ids.shape[1], (ids.shape[0],), generator=gen)
    masked[torch.arange(ids.shape[0]), first] = True
    targets = torch.where(masked, ids, torch.full_like(ids, IGNORE))
    new_ids = torch.where(masked, torch.full_like(ids, mask_token_id), ids)
    return (new_ids, *inputs[1:]), targets


class TextData:
    """Byte-level language-model data from a text file (no tokenizer, nothing downloaded):
    each token is one byte of the file (ids 0-255); step ``s`` reads ``batch_size`` windows of
    the example input's length at seeded offsets. Targets follow ``task`` (causal LM: the
    next byte; masked LM: the masked bytes)."""

    def __init__(self, path: str, example_input: torch.Tensor, batch_size: int, seed: int,
                 task: str | None, task_options: dict[str, Any] | None = None,
                 vocab: int | None = None):
        try:
            raw = open(path, "rb").read()
        except OSError as e:
            raise UsageError(f"cannot read text file {path!r}: {e}") from None
        self.seq = int(example_input.shape[1]) if example_input.dim() > 1 else 16
        if len(raw) <= self.seq + 1:
            raise UsageError(f"text file {path!r} has {len(raw)} bytes, fewer than one "
                             f"sequence of {self.seq + 1}: use a longer file or a shorter --seq")
        if vocab is not None and vocab < 256:
            raise UsageError(f"byte-level text needs a vocabulary of 256 or more, the model has "
                             f"{vocab}: build it with vocab_size=256")
        self.tokens = torch.tensor(list(raw), dtype=torch.long)
        self.batch_size = batch_size
        self.seed = seed
        self.task = task or "causal_lm"
        self.task_options = task_options or {}

    def batch(self, step: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.tokens) - self.seq, (self.batch_size,), generator=gen)
        ids = torch.stack([self.tokens[s:s + self.seq] for s in starts.tolist()])
        if self.task not in ("causal_lm", "masked_lm"):
            raise UsageError(f"text data trains a causal or masked LM, not {self.task}")
        return task_targets(self.task, (ids,), gen, **self.task_options)


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
    if parts == 1:  # one micro-batch: the batch itself (a step's host work, on every step)
        return [value]
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
