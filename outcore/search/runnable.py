"""What a layout must leave the model to run at all: the fewest samples per micro-batch it
trains on (no torch).

The layout search rules out, before ranking, the layouts the model cannot run, and records why
(``outcore plan --explain``). A micro-batch of one sample cannot train

- a batch norm whose input has one value per channel per sample (after a global pool, or a
  ``BatchNorm1d`` over features): PyTorch refuses it ("Expected more than 1 value per channel
  when training");
- a model captured with torch.export at a larger batch: torch.export specialises a dimension of
  size 1, so the model exported again at one sample may not match the planned graph. The run
  places the chosen layout again on the graph captured at its micro-batch when they differ
  (``job.prepare``), so this rule is a preference, not a refusal: such layouts are ruled out
  only while another layout remains (``strict`` False).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from outcore.graph.ir import Graph
from outcore.plan.plan import Plan
from outcore.plan.request import PlanRequest

__all__ = ["Runnable", "has_batch_statistics", "runnable", "statistics_note"]

_BATCH_NORM = re.compile(r"batch_?norm", re.IGNORECASE)


@dataclass(frozen=True)
class Runnable:
    """The fewest samples per micro-batch a model trains on, and why (empty when 1);
    ``strict`` False: fewer can run, and are ruled out only while another layout remains."""

    min_samples: int = 1
    reason: str = ""
    strict: bool = True

    def refusal(self, samples: int) -> str | None:
        """Why a micro-batch of ``samples`` cannot run, or None when it can."""
        if samples >= self.min_samples:
            return None
        return f"a micro-batch of {samples} sample{'s' if samples != 1 else ''}: {self.reason}"


def runnable(g: Graph, *, rescaled: bool) -> Runnable:
    """What ``g``'s model needs of a micro-batch; ``rescaled``: the search plans ``g`` at
    other batch sizes than the one it was captured at (the layout search over its batch)."""
    for i in range(g.num_nodes):
        if not _BATCH_NORM.search(g.op_of(i)):
            continue
        shape = g.attr(i, "shape")
        if shape and len(shape) >= 2 and math.prod(shape[2:]) == 1:
            return Runnable(2, f"batch norm {g.name_of(i)} would see one value per channel "
                               "(PyTorch cannot train it on that)")
    capture = g.meta.get("capture") or {}
    if rescaled and capture.get("path") == "export" and int(g.batch_size or 1) > 1:
        return Runnable(2, "torch.export specialises a batch dimension of 1, so the model "
                           "exported again at one sample may not match its planned graph",
                        strict=False)
    return Runnable()


def has_batch_statistics(g: Graph) -> bool:
    """Whether ``g`` takes statistics over the samples of a micro-batch (batch norm in
    training): its result then depends on how the batch is grouped into micro-batches."""
    return any(_BATCH_NORM.search(g.op_of(i)) for i in range(g.num_nodes))


def statistics_note(g: Graph, req: PlanRequest, plan: Plan) -> str | None:
    """The plan's note on the samples each batch statistic is taken over (None without batch
    statistics): the micro-batches of every model copy, as one device with that many
    micro-batches of the whole batch takes them (the runtime gives copy ``c`` the micro-batches
    ``c * M`` to ``c * M + M - 1``; spatial tiles synchronise theirs)."""
    if not has_batch_statistics(g):
        return None
    chunks = plan.layout.copies * plan.microbatches
    batch = int(g.batch_size or 1)
    samples = batch // chunks if req.whole_batch else batch
    rule = ""
    if req.search_layout and req.microbatches != "auto":
        rule = ("; model copies take whole micro-batches (batch_stats global)"
                if req.batch_stats == "global" else
                "; micro-batches counted per model copy (batch_stats per-copy)")
    return (f"batch statistics: over each of {chunks} micro-batch{'es' if chunks != 1 else ''} "
            f"of {samples} sample{'s' if samples != 1 else ''}, as one device training the "
            f"batch in {chunks} micro-batch{'es' if chunks != 1 else ''} takes them{rule}")
