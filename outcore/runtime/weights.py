"""Starting from weights a user has: a ``.safetensors`` file, a folder of them (a local Hugging
Face checkpoint, ``hf:/path/to/folder``) or a torch state dict, tensors matched to the model's
parameters by name (``outcore train --weights FILE``).

Each rank reads only the tensors it holds: safetensors reads a tensor when asked for it, and a
torch file is memory-mapped (``torch.load(mmap=True)``), so a rank touches only its own pages.
A tied tensor is found under any of its names (Hugging Face files keep the embedding's); a
file whose state dict sits under ``state_dict`` or ``model``, or whose names carry DDP's
``module.`` prefix, is read as well. A name the file lacks, or a shape that differs, is refused
naming the parameter, before any step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from outcore.errors import UsageError

__all__ = ["load_weights"]


class _Reader:
    """The tensors of a weights file by name, read when asked for."""

    def __init__(self, path: str):
        self.path = path
        files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else \
            [Path(path)] if path.endswith(".safetensors") else []
        if files:  # a file, or a folder's (a Hugging Face checkpoint may be split in several)
            from safetensors import safe_open
            opened = [safe_open(str(f), framework="pt", device="cpu") for f in files]
            where = {name: f for f in opened for name in f.keys()}
            self.names = set(where)
            self._get = lambda name: where[name].get_tensor(name)
            return
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:
            raise UsageError(f"cannot read weights from {path}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''} (give a .safetensors "
                             "file or a torch state dict saved with torch.save)") from None
        for key in ("state_dict", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                                  for v in state.values()):
            raise UsageError(f"{path} holds no state dict (a dict of tensors by parameter "
                             "name)")
        if state and all(k.startswith("module.") for k in state):
            state = {k[len("module."):]: v for k, v in state.items()}
        self.names = set(state)
        self._get = state.__getitem__

    def find(self, names: list[str]) -> torch.Tensor | None:
        """The tensor stored under the first of ``names`` the file has."""
        for n in names:
            if n in self.names:
                return self._get(n)
        return None


def load_weights(trainer: Any, path: str) -> None:
    """Set ``trainer``'s parameters, and the buffers the file holds, from ``path`` by name."""
    if not Path(path).exists():
        raise UsageError(f"no weights file at {path}")
    reader = _Reader(path)
    names_of: dict[str, list[str]] = {}  # each tensor's names, the one the ranks use first
    for name, first in trainer.aliases.items():
        names_of.setdefault(first, [first])
        if name != first:
            names_of[first].append(name)
    values, missing = {}, []
    for name, p in trainer.named_params.items():
        value = reader.find(names_of.get(name, [name]))
        if value is None:
            missing.append(name)
            continue
        want = tuple(p.shape)  # a tensor-parallel shard's DTensor has the whole shape
        if tuple(value.shape) != want:
            raise UsageError(f"{path}: {name} has shape {tuple(value.shape)}, the model's is "
                             f"{want}")
        values[name] = value
    if missing:
        raise UsageError(f"{path} has no tensor for {len(missing)} parameter"
                         f"{'s' if len(missing) > 1 else ''} of the model ({missing[0]}"
                         f"{', ...' if len(missing) > 1 else ''}): its names are the model's "
                         "parameter names (model.state_dict())")
    trainer.load_parameters(values)
    with torch.no_grad():
        for name, b in trainer.gm.named_buffers():
            if b.device.type != "meta":
                value = reader.find([name])
                if value is not None and tuple(value.shape) == tuple(b.shape):
                    b.copy_(value)

