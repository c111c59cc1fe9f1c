"""Sharded, atomic checkpoints with torch.distributed.checkpoint, keyed by name only.

Each rank writes the parameters, buffers and optimizer state of its own pieces under their
parameter names (``model.<name>``, ``buffer.<name>``, ``optim.<name>.<key>``) and the state every
rank shares under one name (``optim.hparams``, ``lr_scheduler``, ``step``); DCP keeps one copy
of a key written by several ranks (a replicated parameter is identical on all of them). No key
names a rank, so any plan, device count or parallel mode of the same model loads any checkpoint:
each rank reads the names it holds now (the by-name resharding of
``torch.distributed.checkpoint.state_dict.get_state_dict``, for outcore's piece layout).

A checkpoint is written to ``step_<N>.partial``; after every rank finished, rank 0 makes the
files private (0600), records their SHA-256 digests in ``COMPLETE`` and renames the folder to
``step_<N>``, so a crash mid-write never leaves a folder that looks complete. Before loading,
the digests and permissions are checked (:mod:`outcore.runtime.ckpt_trust`): a checkpoint is
code (DCP's ``.metadata`` is a pickle).
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
from torch.distributed.checkpoint.api import CheckpointException

from outcore.errors import CheckpointError
from outcore.runtime import ckpt_trust

log = logging.getLogger(__name__)
_DONE = ckpt_trust.DONE
# beside the checkpoints: the configuration of the run that writes them and the plan it trains
SAVED_CONFIG = "config.json"
SAVED_PLAN = "plan.json"


def _flatten(trainer: Any, step: int) -> dict[str, Any]:
    """This rank's state under rank-independent names."""
    state = trainer.state_dict()
    flat: dict[str, Any] = {f"model.{k}": _contiguous(v) for k, v in state["model"].items()}
    flat.update({f"buffer.{k}": v for k, v in state["buffers"].items()})
    if "optim" in state:
        for name, st in state["optim"]["state"].items():
            for key, value in st.items():
                flat[f"optim.{name}.{key}"] = _contiguous(value)
        flat["optim.hparams"] = [{k: v for k, v in g.items() if k != "params"}
                                 for g in state["optim"]["param_groups"]]
    if "lr_scheduler" in state:
        flat["lr_scheduler"] = state["lr_scheduler"]
    if "scaler" in state:  # 16-mixed's loss scale
        flat["loss_scale"] = state["scaler"]
    flat["step"] = torch.tensor(step)
    return flat


def _strided(t: Any) -> bool:
    """``t`` is a DTensor sharded chunk by chunk (a fused q/k/v projection's, see
    :mod:`outcore.parallel.tensor.graph_split`)."""
    return any(type(p).__name__ == "_StridedShard" for p in getattr(t, "placements", ()))


def _contiguous(t: Any) -> Any:
    """``t`` with chunk-by-chunk shards re-cut into contiguous ones (a collective): DCP
    records each shard as one contiguous block of the whole tensor."""
    if not _strided(t):
        return t
    from torch.distributed.tensor import DTensor, Shard
    mesh, dims = t.device_mesh, [p.dim for p in t.placements]
    whole = t.full_tensor()
    return DTensor.from_local(whole.chunk(mesh.size(), dim=dims[0])[mesh.get_local_rank()].clone(),
                              mesh, [Shard(d) for d in dims], run_check=False)


def _placed_like(target: Any, value: Any) -> Any:
    """``value`` (loaded, contiguous shards) in ``target``'s placement (chunk-by-chunk
    shards are gathered and re-cut; a collective)."""
    if not _strided(target):
        return value
    from torch.distributed.tensor import DTensor

    from outcore.parallel.tensor.graph_split import chunkwise_shard
    mesh, (place,) = target.device_mesh, target.placements
    local = chunkwise_shard(value.full_tensor(), place.dim, place.split_factor, mesh.size(),
                            mesh.get_local_rank())
    return DTensor.from_local(local.clone(), mesh, target.placements, run_check=False)


def _explain(e: CheckpointException | Exception) -> str:
    """One line per failing rank instead of DCP's ``CheckpointException ranks:dict_keys``."""
    failures = getattr(e, "failures", None)
    if not failures:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    parts = []
    for rank, (exc, _) in sorted(failures.items()):
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        parts.append(f"rank {rank}: {type(exc).__name__} {text}".rstrip())
    return "; ".join(parts)


def save(trainer: Any, directory: str | os.PathLike, step: int) -> Path:
    """Write the state after ``step`` steps to ``directory/step_<step>`` (all ranks call)."""
    root = Path(directory)
    final = root / f"step_{step}"
    partial = root / f"step_{step}.partial"
    if trainer.rank == 0:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True, mode=0o700)
    _barrier()
    trainer.sync_running_stats()  # replicas agree on what is saved under one name
    try:
        dcp.save(_flatten(trainer, step), checkpoint_id=str(partial))
    except (CheckpointException, Exception) as e:
        raise CheckpointError(f"cannot write checkpoint {partial}: {_explain(e)}") from None
    _barrier()
    if trainer.rank == 0:
        ckpt_trust.privatise(partial)
        ckpt_trust.write_marker(partial, step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    _barrier()
    return final


def complete(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every checkpoint in ``directory`` marked complete, newest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = re.fullmatch(r"step_(\d+)", p.name)
        if m and (p / _DONE).exists():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def latest(directory: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest complete checkpoint in ``directory`` as ``(step, path)``, or None."""
    found = complete(directory)
    return found[0] if found else None


def choose(directory: str | os.PathLike) -> tuple[int, Path] | None:
    """The newest checkpoint that passes :func:`ckpt_trust.verify`, or None when there is no
    complete checkpoint. A newer one that fails is skipped with a warning naming the file;
    when every one fails, raises the newest one's error."""
    candidates = complete(directory)
    first_error: CheckpointError | None = None
    for step, path in candidates:
        try:
            ckpt_trust.verify(path)
        except CheckpointError as e:
            first_error = first_error or e
            log.warning("checkpoint %s cannot be used: %s; falling back to an older one",
                        path.name, e)
            continue
        if first_error is not None:
            log.warning("resuming from the older checkpoint %s", path)
        return step, path
    if first_error is not None:
        raise CheckpointError(f"no usable checkpoint in {directory}: {first_error}")
    return None


def load(trainer: Any, path: str | os.PathLike) -> int:
    """Restore ``trainer`` from a checkpoint folder (verified by :func:`choose`); returns the
    step it was taken after. Any plan or device count of the same model can load it."""
    if trainer.optimizer is not None and not trainer.optimizer.state:
        _init_optimizer_state(trainer)
    flat = _flatten(trainer, 0)
    saved = _saved_keys(path)
    if "loss_scale" in flat and "loss_scale" not in saved:
        log.info("%s has no loss scale (written in another precision): starting from %g",
                 path, flat.pop("loss_scale")["scale"])
    stepped = any(k.startswith("optim.") and not k.startswith("optim.hparams") for k in saved)
    if not stepped:  # written before the optimizer's first step (every step so far skipped)
        for k in [k for k in flat if k.startswith("optim.") and k != "optim.hparams"]:
            del flat[k]
    try:
        dcp.load(flat, checkpoint_id=str(path))
    except (CheckpointException, Exception) as e:  # CheckpointException is a BaseException
        raise CheckpointError(f"cannot resume from {path}: {_explain(e)} (was it written for "
                              "this model?)") from None
    trainer.load_parameters({k: _placed_like(p, flat[f"model.{k}"])
                             for k, p in trainer.named_params.items()})
    with torch.no_grad():
        for k, b in trainer.gm.named_buffers():
            if f"buffer.{k}" in flat and b.device.type != "meta":
                b.copy_(flat[f"buffer.{k}"])
    if trainer.optimizer is not None and not stepped:
        trainer.optimizer.state.clear()  # as it was: no state until a step makes it
        _load_hparams(trainer, flat)
    elif trainer.optimizer is not None:
        _load_optimizer(trainer, flat)
    if trainer.lr_scheduler is not None:
        trainer.lr_scheduler.load_state_dict(flat["lr_scheduler"])
    if "loss_scale" in flat:
        trainer.scaler.load_state_dict(flat["loss_scale"])
    return int(flat["step"])


def _saved_keys(path: str | os.PathLike) -> set[str]:
    """The top-level names a checkpoint holds."""
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    return {k.split(".")[0] if k.startswith("loss_scale") else k
            for k in meta.state_dict_metadata}


def _load_optimizer(trainer: Any, flat: dict[str, Any]) -> None:
    index = {id(p): k for k, p in trainer.named_params.items()}
    sharder = getattr(trainer, "sharder", None)
    if sharder is not None:  # the shards' state is sliced from the whole state by name
        sharder.load_optimizer_state(trainer.optimizer.state,
                                     lambda name, key: flat[f"optim.{name}.{key}"])
    for group in trainer.optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in index:  # a shard, loaded above
                continue
            st = trainer.optimizer.state[p]
            for key in list(st):
                value = flat[f"optim.{index[id(p)]}.{key}"]
                if isinstance(st[key], torch.Tensor):
                    st[key].copy_(_placed_like(st[key], value))
                else:
                    st[key] = value
    _load_hparams(trainer, flat)


def _load_hparams(trainer: Any, flat: dict[str, Any]) -> None:
    for group, saved in zip(trainer.optimizer.param_groups, flat["optim.hparams"]):
        group.update({k: v for k, v in saved.items() if k != "params"})


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
