"""Sharded, atomic checkpoints with torch.distributed.checkpoint.

Each rank writes its own pieces' parameters, buffers and optimizer state (keys are parameter
names, so shards never collide; a parameter held by two ranks is identical on both). A checkpoint
is written to ``step_<N>.partial`` and renamed to ``step_<N>`` by rank 0 only after every rank
has finished writing, so a crash mid-write never leaves a directory that looks complete.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from outcore.errors import RuntimeFailure

log = logging.getLogger(__name__)
_DONE = "COMPLETE"


def _flatten(trainer: Any, step: int) -> dict[str, Any]:
    rank = trainer.rank
    state = trainer.state_dict()
    flat: dict[str, Any] = {f"model.{k}": v for k, v in state["model"].items()}
    flat.update({f"buffer.{k}": v for k, v in state["buffers"].items()})
    if "optim" in state:
        for name, st in state["optim"]["state"].items():
            for key, value in st.items():
                flat[f"optim.{name}.{key}"] = value
        flat[f"rank{rank}.param_groups"] = state["optim"]["param_groups"]
    if "lr_scheduler" in state:
        flat[f"rank{rank}.lr_scheduler"] = state["lr_scheduler"]
    flat["step"] = torch.tensor(step)
    return flat


def save(trainer: Any, directory: str | os.PathLike, step: int) -> Path:
    """Write the state after ``step`` steps to ``directory/step_<step>`` (all ranks call)."""
    root = Path(directory)
    final = root / f"step_{step}"
    partial = root / f"step_{step}.partial"
    if trainer.rank == 0:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
    _barrier()
    trainer.sync_running_stats()  # replicas agree on what is saved under one name
    dcp.save(_flatten(trainer, step), checkpoint_id=str(partial))
    _barrier()
    if trainer.rank == 0:
        (partial / _DONE).write_text(str(step))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    _barrier()
    return final


def latest(directory: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest complete checkpoint in ``directory`` as ``(step, path)``, or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    best = None
    for p in root.iterdir():
        m = re.fullmatch(r"step_(\d+)", p.name)
        if m and (p / _DONE).exists():
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, p)
    return best


def load(trainer: Any, path: str | os.PathLike) -> int:
    """Restore ``trainer`` from a checkpoint directory; returns the step it was taken after."""
    if trainer.optimizer is not None and not trainer.optimizer.state:
        _init_optimizer_state(trainer)
    flat = _flatten(trainer, 0)
    try:
        dcp.load(flat, checkpoint_id=str(path))
    except Exception as e:  # a missing key or corrupt file: say which checkpoint
        raise RuntimeFailure(f"cannot resume from {path}: {e}") from e
    with torch.no_grad():
        for k, p in trainer.named_params.items():
            p.copy_(flat[f"model.{k}"])
        for k, b in trainer.gm.named_buffers():
            if f"buffer.{k}" in flat and b.device.type != "meta":
                b.copy_(flat[f"buffer.{k}"])
    if trainer.optimizer is not None:
        index = {id(p): k for k, p in trainer.named_params.items()}
        for group in trainer.optimizer.param_groups:
            for p in group["params"]:
                st = trainer.optimizer.state[p]
                for key in list(st):
                    value = flat[f"optim.{index[id(p)]}.{key}"]
                    if isinstance(st[key], torch.Tensor):
                        st[key].copy_(value)
                    else:
                        st[key] = value
        groups = flat[f"rank{trainer.rank}.param_groups"]
        for group, saved in zip(trainer.optimizer.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
    if trainer.lr_scheduler is not None:
        trainer.lr_scheduler.load_state_dict(flat[f"rank{trainer.rank}.lr_scheduler"])
    return int(flat["step"])


def _init_optimizer_state(trainer: Any) -> None:
    """Create the optimizer's state tensors (a zero-gradient step that changes nothing)."""
    opt = trainer.optimizer
    saved = [dict(g) for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        if "weight_decay" in g:
            g["weight_decay"] = 0.0
    for p in trainer.params:
        p.grad = torch.zeros_like(p)
    before = [p.detach().clone() for p in trainer.params]
    opt.step()
    with torch.no_grad():
        for p, b in zip(trainer.params, before):
            p.copy_(b)
    opt.zero_grad(set_to_none=True)
    for g, s in zip(opt.param_groups, saved):
        g.update({k: v for k, v in s.items() if k != "params"})


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
