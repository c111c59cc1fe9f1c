"""The planning request: everything a planner is asked, validated once (no torch).

The CLI, the Python API and ``outcore train`` all build one :class:`PlanRequest` and hand it to
the search (:func:`outcore.search.search`), instead of a dozen keyword arguments
passed down through several functions (torchtitan's ``JobConfig`` habit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from outcore.config import OptimizerOptions
from outcore.errors import UsageError
from outcore.hardware.cluster import make_cluster
from outcore.hardware.spec import Cluster, DeviceSpec
from outcore.plan.layout import MODES, check_depth, check_positive
from outcore.plan.plan import SCHEDULES
from outcore.plan.policies import CHOICES
from outcore.plan.spatial import check_spatial_request
from outcore.units import parse_bytes

__all__ = ["BATCH_STATS", "PlanRequest", "replicas_asked"]

# how a model's batch statistics group the samples (PlanRequest.batch_stats)
BATCH_STATS = ("global", "per-copy")


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan for.

    Attributes:
        devices: ranks the plan may use in all (the whole mesh).
        memory_bytes: per-device memory limit (None: unlimited).
        cluster: devices and links (see :func:`outcore.hardware.cluster.make_cluster`).
        strategy: ``auto`` or a planner of ``outcore.placers.strategies()``.
        parallel: GEMS mode ``mp``, ``mast`` or ``master``.
        replicas: for ``master``, the replica count (None: the fastest that fits).
        dp: data-parallel copies of the model-parallel group (must divide ``devices``).
        tp: tensor-parallel ranks inside every model-parallel device slot (Megatron layout of
            the graph's Linears / Embeddings, :mod:`outcore.graph.tensor_pairs`); ``dp x tp``
            must divide ``devices``. ``None``: the search chooses (:meth:`tp_options`).
        depth: data-parallel copies that shard each device slot's parameters, gradients and
            optimizer state among themselves (FSDP / ZeRO-3; AxoNN's depth dimension; divides
            ``dp``; :class:`~outcore.plan.layout.Layout`). ``None``: the search chooses
            (:meth:`depth_options`).
        sp: spatial degree (1: not used); ``sp`` tiles the layers before the join over
            ``sp`` ranks, which ``devices`` includes (``outcore.plan.spatial``).
        sp_join: the join node's name (None: the planner chooses it from the memory model).
        sp_grid: the tile grid, ``ROWSxCOLS`` (None: ``sp`` tiles over the height).
        microbatches: micro-batches per iteration and model copy, or ``"auto"``: the search
            chooses the count (a divisor of the batch); then, and when ``search_layout`` is
            set, the graph is costed for the whole global batch of one iteration.
        schedule: ``gpipe``, ``1f1b`` or ``auto`` (the search simulates the best placement of
            several micro-batches over several devices with both and keeps the faster: 1F1B on
            a tie, which holds fewer micro-batches' activations).
        optimizer: the optimizer the memory model assumes (``adam``: 4 x params).
        memory_policy: ``auto``, ``none``, ``checkpoint`` or ``offload``.
        seed: for randomised planners (METIS); the others are deterministic.
        search_layout: the search also chooses ``dp`` and the GEMS mode and replicas
            (``outcore.search.layouts.candidate_layouts``) instead of taking them as given.
        batch_stats: for a model with batch statistics (batch norm) whose layout the search
            chooses: ``global``, a given ``microbatches`` counts the micro-batches of the whole
            batch (model copies take whole micro-batches, so every batch norm sees the samples
            it would on one device); ``per-copy``, it counts per model copy (DDP's statistics).
    """

    devices: int
    cluster: Cluster
    memory_bytes: float | None = None
    strategy: str = "auto"
    parallel: str = "mp"
    replicas: int | None = None
    dp: int = 1
    tp: int | None = 1
    depth: int | None = 1
    sp: int = 1
    sp_join: str | None = None
    sp_grid: str | None = None
    microbatches: int | str = 1
    schedule: str = "auto"
    optimizer: str = "adam"
    memory_policy: str = "auto"
    seed: int = 0
    search_layout: bool = False
    batch_stats: str = "global"

    def __post_init__(self) -> None:
        check_positive("devices", self.devices)
        if self.microbatches != "auto":
            check_positive("micro-batches", self.microbatches)
        check_positive("--dp", self.dp)
        if self.tp is not None:
            check_positive("--tp", self.tp)
        if self.parallel not in MODES:
            raise UsageError(f"unknown parallel mode {self.parallel!r}: use {', '.join(MODES)}")
        if self.devices % (self.dp * (self.tp or 1)):
            raise UsageError(f"--dp {self.dp} x --tp {self.tp} must divide --devices "
                             f"{self.devices}")
        if self.parallel != "mp" and self.model_parallel_devices < 2:
            raise UsageError(f"{self.parallel} needs at least 2 model-parallel devices; got "
                             f"{self.model_parallel_devices}")
        if self.replicas is not None and (self.parallel != "master" or self.replicas < 2
                                          or self.replicas % 2):
            raise UsageError("--replicas is for --parallel master: an even count (2, 4, ...)")
        if self.depth is not None:
            check_positive("--shard", self.depth)
            check_depth(self.depth, self.dp, 1 if self.parallel == "mp" else 2)
        check_positive("--sp", self.sp)
        if self.sp > 1:
            check_spatial_request(self)
        if self.schedule not in (*SCHEDULES, "auto"):
            raise UsageError(f"unknown schedule {self.schedule!r}: use {', '.join(SCHEDULES)} "
                             "or auto")
        if self.memory_policy not in CHOICES:
            raise UsageError(f"unknown memory policy {self.memory_policy!r}: use "
                             f"{', '.join(CHOICES)}")
        if self.batch_stats not in BATCH_STATS:
            raise UsageError(f"unknown batch statistics {self.batch_stats!r}: use "
                             f"{' or '.join(BATCH_STATS)}")
        if self.cluster.size < self.devices:
            raise UsageError(f"the cluster has {self.cluster.size} devices, the request "
                             f"{self.devices}: pass a larger cluster or fewer devices")

    @property
    def fixed_tp(self) -> int:
        """``tp`` once fixed (the layout search fixes it before anything is placed)."""
        assert self.tp is not None, "a placement needs the tensor-parallel degree fixed"
        return self.tp

    @property
    def fixed_depth(self) -> int:
        """``depth`` once fixed (the layout search fixes it before anything is placed)."""
        assert self.depth is not None, "a placement needs the sharding degree fixed"
        return self.depth

    @property
    def fixed_microbatches(self) -> int:
        """``microbatches`` once fixed (the layout search fixes it before anything is
        placed)."""
        assert self.microbatches != "auto", "a placement needs the micro-batches fixed"
        return int(self.microbatches)

    @property
    def first_schedule(self) -> str:
        """The schedule placements are simulated with: the request's, 1F1B for ``auto``
        (the search then tries GPipe on its best placement)."""
        return "1f1b" if self.schedule == "auto" else self.schedule

    @property
    def model_parallel_devices(self) -> int:
        """Device slots one model-parallel group spans (``devices / (dp x tp)``; each slot is
        ``tp`` ranks)."""
        return self.devices // (self.dp * (self.tp or 1))

    def tp_options(self) -> list[int]:
        """Tensor-parallel degrees the search tries: the request's, or (``tp=None``) 1, 2, 4
        and 8 where they divide the devices of one data-parallel copy."""
        if self.tp is not None:
            return [self.tp]
        per_copy = self.devices // self.dp
        return [t for t in (1, 2, 4, 8) if per_copy % t == 0]

    def depth_options(self) -> list[int]:
        """Sharding degrees the search tries: the request's, or (``depth=None``) every divisor
        of ``dp`` (1: no sharding), where the layout allows sharding."""
        if self.depth is not None:
            return [self.depth]
        if self.parallel != "mp":
            return [1]
        return [d for d in range(1, self.dp + 1) if self.dp % d == 0]

    @property
    def whole_batch(self) -> bool:
        """True when the search chooses the batch split, so the graph holds the global batch."""
        return self.microbatches == "auto" or self.search_layout

    def replica_options(self) -> list[int]:
        """Replica counts the search tries for the request's GEMS mode."""
        if self.parallel == "mp":
            return [1]
        if self.parallel == "mast":
            return [2]
        K = self.model_parallel_devices
        return [self.replicas] if self.replicas else [r for r in (8, 4, 2) if r <= K]

    def replace(self, **changes: Any) -> "PlanRequest":
        return replace(self, **changes)

    @staticmethod
    def make(devices: int, memory: str | float | None = None, *,
             bandwidth: str | float = "16GB/s", latency: str | float = "25us",
             device: str | DeviceSpec | None = None, host_cores: int | None = None,
             cluster: Cluster | None = None, **fields: Any) -> "PlanRequest":
        """A request from user-facing units (``memory="16GiB"``, ``bandwidth="16GB/s"``);
        ``cluster`` (if given) replaces the flat cluster built from the link and device."""
        check_positive("devices", devices)
        devices = int(devices)
        mem = None if memory is None else float(parse_bytes(memory))
        if mem is not None and mem <= 0:
            raise UsageError(f"memory must be positive, got {memory!r}")
        fields = _request_fields(fields)
        if cluster is None:
            cluster = make_cluster(devices, memory, bandwidth, latency, device, host_cores)
        else:
            cluster = cluster.with_memory(mem if mem is not None else math.inf)
        return PlanRequest(devices=devices, memory_bytes=mem, cluster=cluster, **fields)


def _request_fields(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` as request fields: the command line's spellings taken as they mean there
    (``layout="auto"|"given"``, ``shard=N`` for ``depth``, ``momentum=`` with SGD); any other
    name is refused, naming the fields a request has."""
    from dataclasses import fields as dataclass_fields
    from difflib import get_close_matches

    out = dict(given)
    if "layout" in out:
        layout = out.pop("layout")
        if layout not in ("auto", "given", None):
            raise UsageError(f"layout must be 'auto' or 'given', got {layout!r}")
        out.setdefault("search_layout", layout == "auto")
    if "shard" in out:
        out.setdefault("depth", out.pop("shard"))
    if "momentum" in out:  # the optimizer as the plan names it (OptimizerOptions.planned)
        momentum = float(out.pop("momentum") or 0.0)
        if "optimizer" in out:
            out["optimizer"] = OptimizerOptions(optimizer=out["optimizer"],
                                                momentum=momentum).planned
    known = {f.name for f in dataclass_fields(PlanRequest)} - {"devices", "memory_bytes",
                                                               "cluster"}
    unknown = sorted(set(out) - known)
    if unknown:
        names = sorted(known | {"bandwidth", "latency", "device", "host_cores", "cluster",
                                "layout", "shard", "momentum"})
        near = get_close_matches(unknown[0], names, 1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UsageError(f"a plan request has no option {unknown[0]!r}{hint}: it takes "
                         f"{', '.join(names)}")
    return out


def replicas_asked(parallel: str, replicas: int | None, devices: int, dp: int) -> int:
    """GEMS replicas a run asks for (the capture's micro-batch depends on them)."""
    if parallel == "mp":
        return 1
    if parallel == "mast":
        return 2
    return replicas or (4 if devices // max(dp, 1) >= 4 else 2)
