"""What a training run reports: measured time, memory and communication beside the plan's
prediction (:class:`TrainReport`, ``report.json``), the measured timelines drawn under the
simulated one, and rank 0's metrics followed as they are written."""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from outcore.config import TrainConfig
from outcore.graph.ir import Graph
from outcore.plan.plan import Plan

log = logging.getLogger(__name__)

__all__ = ["MetricsWatcher", "TrainReport", "report"]


@dataclass
class TrainReport:
    """What a run did, next to what the plan predicted."""

    config: TrainConfig
    plan: Plan
    run_dir: Path
    losses: list[float]
    step_s: list[float]
    peak_bytes: list[int]
    busy_s: list[float]
    predicted: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    comm: list[dict[str, Any]] = field(default_factory=list)  # trace.comm_profile rows
    # per rank, the process's peak resident memory: its tensors (``peak_bytes``) and all
    # around them (interpreter, libraries, allocator slack) that a node's RAM must hold
    host_peak_bytes: list[int] = field(default_factory=list)

    def per_rank(self, key: str) -> list[Any]:
        """The plan's per-device prediction ``key`` (``peak_bytes``, ``busy_s``) for each rank,
        beside the measured lists: the ``tp`` ranks of a device slot share its figure (None
        where the prediction has none)."""
        values = list(self.predicted.get(key) or [])
        tp = self.plan.layout.tp
        return [values[r // tp] if r // tp < len(values) else None
                for r in range(self.plan.devices)]

    @property
    def median_step_s(self) -> float:
        steady = self.step_s[1:] if len(self.step_s) > 1 else self.step_s
        return statistics.median(steady) if steady else float("nan")

    @property
    def samples_per_s(self) -> float:
        return self.config.graph.batch_size / self.median_step_s if self.step_s \
            else float("nan")

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config
        return {"model": cfg.graph.model, "devices": self.plan.devices,
                "strategy": self.plan.strategy, "batch_size": cfg.graph.batch_size,
                "microbatches": cfg.planning.microbatches, "schedule": cfg.planning.schedule,
                "steps": len(self.losses), "losses": self.losses, "step_s": self.step_s,
                "median_step_s": self.median_step_s, "samples_per_s": self.samples_per_s,
                "peak_bytes": self.peak_bytes, "host_peak_bytes": self.host_peak_bytes,
                "busy_s": self.busy_s,
                "memory_bytes": self.plan.memory_bytes, "predicted": self.predicted,
                "predicted_peak_bytes_per_rank": self.per_rank("peak_bytes"),
                "files": self.files, "comm": self.comm}


class MetricsWatcher:
    """Tails rank 0's metrics file and hands each new line of this run to a callback.

    The file may be one an earlier run left in the same run folder, until rank 0 replaces it
    (a fresh run makes a new file, a resumed one rewrites it keeping its earlier steps): lines
    stamped before this watcher started are not this run's progress and are skipped, and a
    replaced or shorter file is read from its start. A line that is not JSON is skipped: the
    progress display never stops a run."""

    def __init__(self, path: Path, callback: Callable[[dict[str, Any]], None] | None):
        self.path, self.callback, self.offset = path, callback, 0
        self.since = time.time()
        self.inode: int | None = None

    def poll(self) -> None:
        if self.callback is None:
            return
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:
                    self.inode, self.offset = st.st_ino, 0
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1  # a torn last line waits for its end
        self.offset += end
        for line in chunk[:end].decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and float(record.get("time", 0)) >= self.since:
                self.callback(record)


def report(cfg: TrainConfig, g: Graph, p: Plan, root: Path,
           results: list[dict[str, Any]]) -> TrainReport:
    """Rank 0's results (its figures hold every rank's) beside the plan's prediction, written
    to ``report.json`` with the timelines drawn."""
    r0 = results[0]
    report = TrainReport(cfg, p, root, r0["losses"], r0["step_s"], r0["peak_bytes"],
                         r0["busy_s"], dict(p.predicted),
                         host_peak_bytes=list(r0.get("host_peak_bytes", [])))
    files = {"graph": str(root / "graph.json"), "plan": str(root / "plan.json"),
             "metrics": cfg.run.metrics_out or ""}
    trace_dir = cfg.worker.trace_dir
    if trace_dir and Path(trace_dir).is_dir():
        files.update(_timeline_files(cfg, g, p, root, report))
    report.files = files
    (root / "report.json").write_text(json.dumps(_strict(report.to_dict()), indent=1,
                                                 allow_nan=False))
    return report


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities as None (strict JSON: a skipped step has no loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _timeline_files(cfg: TrainConfig, g: Graph, p: Plan, root: Path,
                    report: TrainReport | None = None) -> dict[str, str]:
    """Merge the ranks' measured timelines; draw them under the simulator's prediction."""
    from outcore.api import simulate
    from outcore.trace import (
        Timeline,
        comm_profile,
        load_events,
        save_chrome_trace,
        with_inner_collectives,
    )

    parts = sorted(Path(cfg.worker.trace_dir or "").glob("rank*.json"))
    if not parts:
        return {}
    events = []
    for part in parts:
        events += list(load_events(part).events)
    measured = Timeline(p.devices // p.layout.tp, tuple(sorted(events, key=lambda e: e.start_s)),
                        max((e.end_s for e in events), default=0.0), source="measured")
    sim = simulate(p, g, schedule_file=cfg.planning.schedule_file)
    # a sharded bucket whose shard no other copy holds sums nothing (the runtime records none)
    idle = {f"AR{b}" for b, ring in enumerate(sim.schedule.meta.get("bucket_ring", ()))
            if ring == 1}
    predicted = with_inner_collectives(sim.timeline, sim.costs.collectives)
    if p.spatial is not None:
        predicted = _tiles_communicate(predicted, p)
    if idle:
        predicted = replace(predicted, events=tuple(
            e for e in predicted.events if not (e.kind == "allreduce" and e.label in idle)))
    if report is not None:
        report.comm = comm_profile(measured, predicted)
    out = {"trace": str(save_chrome_trace(root / "trace.json", [predicted, measured],
                                          ["predicted", "measured"]))}
    try:
        from outcore.viz import draw_comparison
        draw_comparison(predicted, measured, root / "timeline.png")
        out["timeline"] = str(root / "timeline.png")
    except Exception as e:  # a picture must never fail a finished training run
        log.warning("could not draw the timeline: %s", e)
    return out


def _tiles_communicate(tl: Any, p: Plan) -> Any:
    """``tl`` with each extra tile rank running its spatial stage's rank's tile communication
    (halos, statistics, the join) in lock-step: the simulated timeline has it on that rank."""
    from outcore.plan.spatial import home_rank, tile_ranks
    sp, extra = p.spatial, []
    assert sp is not None
    for c in range(p.layout.copies):
        home = home_rank(p.stages, sp, c, p.layout.maps)
        mine = [e for e in tl.events if e.rank == home and e.kind.startswith("sp ")]
        for r in tile_ranks(p.stages, sp.tiles, p.layout.dp, c):
            extra += [e._replace(rank=r) for e in mine]
    return replace(tl, events=tuple(sorted([*tl.events, *extra], key=lambda e: e.start_s)))
