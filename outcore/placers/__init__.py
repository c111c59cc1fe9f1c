"""Placers: put every node of a training graph on one of K devices under a memory limit,
judged by the node-level emulator. Each placer is one module with a
:class:`~outcore.placers.registry.Placer`, registered by name below; :func:`partition` runs
one. Pure numpy (inner loops compiled with numba when it is installed); no torch.
"""

from outcore.placers import baselines, contiguous, pardnn, pipeline, subgraph
from outcore.placers.emulate import Emulation, emulate
from outcore.placers.registry import (
    Placement,
    Placer,
    always_simulated,
    auto_placers,
    get_placer,
    placer_names,
    register,
    strategies,
    unregister,
)
from outcore.placers.result import PartitionResult
from outcore.placers.run import partition, placements

# registration order: the order ``strategy="auto"`` runs its placers in and breaks ties by, and
# the order ``outcore plan --help`` lists them
for _placer in (pardnn.ParDNN, pipeline.Pipeline, subgraph.SubGraph, contiguous.Contiguous,
                baselines.RoundRobin, baselines.Chunks, baselines.Metis, baselines.Heft):
    register(_placer)

__all__ = ["Emulation", "PartitionResult", "Placement", "Placer", "always_simulated",
           "auto_placers", "emulate",
           "get_placer", "partition", "placements", "placer_names", "register", "strategies",
           "unregister"]
