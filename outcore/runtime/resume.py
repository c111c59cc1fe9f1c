"""What a training run does with its checkpoint folder and metrics file before and after the
steps: lock the folder (one writer), pick the checkpoint to resume from (rank 0 decides, every
rank follows), say what happened, and keep the metrics file valid JSON Lines with each step once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch.distributed as dist

from outcore.config import TrainConfig
from outcore.errors import CheckpointError, OutcoreError, UsageError
from outcore.runtime import checkpoint, ckpt_trust

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """Where a run starts: its step, the checkpoint it resumed from, the lock it holds."""

    step: int
    checkpoint: Path | None
    lock: ckpt_trust.FolderLock | None


def _share(value: Any, world: int) -> Any:
    """Rank 0's ``value`` on every rank."""
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rank0_decides(cfg: TrainConfig) -> tuple[Any, ckpt_trust.FolderLock | None]:
    """Lock the folder and choose the checkpoint; errors become text for every rank."""
    lock = None
    try:
        lock = ckpt_trust.acquire(cfg.run.checkpoint_dir)
        found = checkpoint.choose(cfg.run.checkpoint_dir) if cfg.run.resume else None
        return ("ok", found), lock
    except OutcoreError as e:
        if lock is not None:
            lock.release()
        return ("error", (type(e).__name__, str(e))), None


def begin(trainer: Any, cfg: TrainConfig) -> Start:
    """Lock ``cfg.run.checkpoint_dir`` (rank 0) and load the newest usable checkpoint on every
    rank when resuming. Every rank raises the same error when that fails."""
    if not cfg.run.checkpoint_dir:
        if cfg.run.resume:
            raise UsageError("--resume needs --checkpoint-dir (the folder to resume from)")
        return Start(0, None, None)
    rank, world = trainer.rank, trainer.world
    decision, lock = _rank0_decides(cfg) if rank == 0 else (None, None)
    status, value = _share(decision, world)
    if status == "error":
        kind, text = value
        raise (UsageError if kind == "UsageError" else CheckpointError)(text)
    try:
        return _load(trainer, cfg, value, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _load(trainer: Any, cfg: TrainConfig, found: tuple[int, Path] | None,
          lock: ckpt_trust.FolderLock | None) -> Start:
    if not cfg.run.resume:
        return Start(0, None, lock)
    if found is None:
        if trainer.rank == 0:
            log.warning("--resume: no complete checkpoint in %s; starting fresh from step 0",
                        cfg.run.checkpoint_dir)
        return Start(0, None, lock)
    step, path = found
    refuse_finished(step, path, cfg.run.steps)
    loaded = checkpoint.load(trainer, path)
    if trainer.rank == 0:
        log.warning("resumed from step %d (%s)", loaded, path)
    return Start(loaded, path, lock)


def open_metrics(path: str | None, start: int) -> TextIO | None:
    """Open the metrics file for a run starting at ``start``: a fresh run truncates it; a
    resumed run keeps the lines of steps before ``start`` (a crashed run may have logged
    steps after its last checkpoint, which are now replayed) and drops torn lines."""
    if not path:
        return None
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if start == 0 or not p.exists():
        p.unlink(missing_ok=True)  # a new file: a reader of the old one sees it replaced
        return open(p, "w")
    kept = []
    for line in p.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) < start:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in kept))
    os.replace(tmp, p)
    return open(p, "a")


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN/inf float replaced by None (JSON null): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    return value


def json_line(record: dict[str, Any]) -> str:
    """One metrics line; never a bare ``NaN`` or ``Infinity``."""
    return json.dumps(finite_or_none(record), allow_nan=False) + "\n"


def refuse_finished(step: int, path: Path, steps: int) -> None:
    """Refuse to resume from a checkpoint at or after the run's last step."""
    if step >= steps:
        raise UsageError(f"nothing to resume: {path} is after step {step} and the run has "
                         f"{steps} steps; pass a larger --steps to train on, or drop "
                         "--resume to start over")
