"""A run's weights out of its checkpoint, as one ``.safetensors`` file that plain PyTorch and
``transformers`` load (``outcore export``).

A checkpoint holds every parameter and buffer under its model name (``model.<name>``,
``buffer.<name>``; :mod:`outcore.runtime.checkpoint`), so the model's state dict is those
entries, read alone: the optimizer state is not loaded. The checkpoint is verified first (its
files' digests and permissions: it is code). For a Hugging Face model, a folder given as the
output also gets its ``config.json``, so ``AutoModel*.from_pretrained(folder)`` loads it.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from outcore.errors import CheckpointError, UsageError
from outcore.runtime import checkpoint, ckpt_trust

__all__ = ["export_weights"]


def _checkpoint_of(path: Path) -> tuple[int, Path]:
    """A ``step_<N>`` folder, or the newest usable one in a checkpoint directory."""
    if (path / ckpt_trust.DONE).is_file():
        return ckpt_trust.verify(path), path
    found = checkpoint.choose(path)
    if found is None:
        raise UsageError(f"no complete checkpoint in {path} (a --checkpoint-dir of outcore "
                         "train, or one of its step_<N> folders)")
    return found


def model_state(path: str | Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The step and the model's parameters and buffers, by name, of a checkpoint."""
    step, folder = _checkpoint_of(Path(path))
    reader = dcp.FileSystemReader(str(folder))
    meta = reader.read_metadata().state_dict_metadata
    state: dict[str, Any] = {}
    for key, m in meta.items():
        if key.startswith(("model.", "buffer.")) and hasattr(m, "size"):
            state[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": it is one
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, no_dist=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {folder}: {type(e).__name__}: {e}") from None
    return step, {k.split(".", 1)[1]: v for k, v in state.items()}


def export_weights(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the model state of checkpoint ``path`` to ``out``: a ``.safetensors`` file, or a
    folder (``model.safetensors``, and the ``config.json`` of a Hugging Face model). Returns
    what was written."""
    from safetensors.torch import save_file

    step, state = model_state(path)
    out = Path(out)
    if out.suffix == ".safetensors":
        out.parent.mkdir(parents=True, exist_ok=True)
        target, folder = out, None
    else:
        out.mkdir(parents=True, exist_ok=True)
        target, folder = out / "model.safetensors", out
    save_file({k: v.contiguous() for k, v in state.items()}, str(target))
    written = {"step": step, "tensors": len(state), "file": str(target),
               "bytes": sum(v.numel() * v.element_size() for v in state.values())}
    if folder is not None:
        config = _hf_config_of(Path(path))
        if config is not None:
            written["config"] = str(config(folder))
    return written


def _hf_config_of(path: Path) -> Any:
    """A writer of the run's Hugging Face ``config.json`` (None for another model), from the
    configuration saved beside the checkpoints."""
    root = path if (path / checkpoint.SAVED_CONFIG).is_file() else path.parent
    saved = root / checkpoint.SAVED_CONFIG
    if not saved.is_file():
        return None
    model = str(json.loads(saved.read_text()).get("graph", {}).get("model", ""))
    if not model.startswith("hf:"):
        return None
    from outcore.zoo import build_model
    from outcore.zoo.ecosystem import local_folder

    source = local_folder(model[3:].split(":")[0])
    if source is not None:
        return lambda folder: Path(shutil.copy(source / "config.json", folder / "config.json"))
    _, net = build_model(model, weights=False)

    def write(folder: Path) -> Path:
        net.config.architectures = [type(net).__name__]
        net.config.save_pretrained(str(folder))
        return folder / "config.json"
    return write
