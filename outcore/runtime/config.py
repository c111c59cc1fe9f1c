"""The one configuration of a training run (the CLI and the Python API both fill it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainConfig:
    """Everything a worker needs to train, besides the graph and the plan.

    Attributes:
        model: model name (``torchvision:resnet18``, ``outcore:mlp``, ``file.py:fn``).
        input_shape: example input shape (batch first) or None for the model's default.
        batch_size: global batch per step.
        microbatches: micro-batches per step (the batch must divide evenly).
        steps: training steps to run (in total, counting resumed ones).
        schedule: ``gpipe``, ``1f1b`` or ``auto`` (the plan's).
        optimizer: ``adam``, ``adamw`` or ``sgd``; ``lr``, ``momentum``, ``weight_decay``.
        lr_schedule: ``none``, ``cosine`` or ``step`` (×0.1 every third of the run).
        seed: seeds weights and data.
        data: ``synthetic`` or ``imagefolder:PATH``.
        metrics_out: JSONL file, one object per step (written by rank 0).
        trace_dir: write a measured Chrome trace / timeline per rank of the last step.
        checkpoint_dir, checkpoint_every, resume: sharded checkpoints.
        schedule_file: an ``outcore-schedule/1`` file whose action lists the ranks run
            (``outcore plan --schedule-out``); None: the plan's own lowering.
        checkpoint_dir, checkpoint_every, resume: sharded checkpoints (a checkpoint is code:
            resume only from folders you wrote; see docs/runtime.md).
        on_nonfinite: ``stop`` (default: end the run at the first NaN/inf loss or gradient,
            naming the step and the last good checkpoint) or ``skip`` (skip that step's
            optimizer update and go on).
        timeout_s: longest wait for any message, collective or worker.
        track_memory: measure each rank's peak tensor memory (on the first two steps and
            every hundredth; other steps repeat the latest measurement, named in the metrics).
        threads: torch threads per worker.
        return_state: return every rank's final parameters (tests).
        fail_at_step: make ``fail_rank`` raise (or hang) at this step (fault tests).
        spin_us: how long same-host receives poll before blocking, decided by the launching
            process (``outcore.core.samehost.spin_s``); None: each worker decides;
            ``OUTCORE_P2P_SPIN_US`` in the environment wins over both.
    """

    model: str
    input_shape: tuple[int, ...] | None = None
    batch_size: int = 8
    microbatches: int = 1
    steps: int = 10
    schedule: str = "auto"
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "none"
    seed: int = 0
    data: str = "synthetic"
    metrics_out: str | None = None
    trace_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    schedule_file: str | None = None
    on_nonfinite: str = "stop"
    timeout_s: float = 60.0
    track_memory: bool = True
    threads: int | None = 1
    return_state: bool = False
    fail_at_step: int = -1
    fail_rank: int = -1
    fail_mode: str = "raise"
    task: str | None = None  # what the targets are (runtime.data); None: from the model
    leaves: tuple[str, ...] = ()  # module paths or class names captured as single layers
    spin_us: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
