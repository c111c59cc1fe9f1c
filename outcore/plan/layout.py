"""The process mesh a plan runs on: one typed value for every parallel dimension (no torch).

A plan's ranks form the mesh ``dp x stages x tp x sp``:

* ``stages`` — the model-parallel devices one copy of the model is placed over (the plan's
  ``assignment`` gives every node its stage: a pipeline stage, a ParDNN device, a SUPER branch);
* ``replicas`` — GEMS model replicas sharing those devices (``mode`` ``mast``: a second replica in
  reverse stage order; ``master``: 2, 4, ... replicas, shifted and reversed), with ``maps[k][s]``
  the device holding stage ``s`` of replica ``k`` (Jain et al., SC 2020, section 4);
* ``dp`` — data-parallel copies of the whole model-parallel group;
* ``tp`` — tensor (intra-layer) degree: every device slot of a stage is ``tp`` consecutive ranks
  (rank ``slot * tp + t``) holding shard ``t`` of the slot's split layers (Megatron-LM);
* ``depth`` — FSDP / ZeRO-3 sharding over the data-parallel copies (AxoNN's depth dimension,
  Singh et al., IPDPS 2022; Rajbhandari et al., SC 2020): copies ``d`` with the same
  ``d // depth`` hold ``1 / depth`` of each device slot's parameters, gradients and optimizer
  state each (shard ``d % depth``), gather a piece's parameters before it runs and
  reduce-scatter its gradients after its backward; with ``dp > depth`` the shards are also
  all-reduced over the ``dp / depth`` groups (hybrid sharding). Parameters shared between
  slots of one copy (tied weights) stay whole;
* ``sp`` — spatial (tile) degree of the stage holding the graph's inputs (MPI4DL's SP + LP, Jain
  et al.): its layers before the join run on ``sp`` tiles, so one copy of the model uses
  ``stages - 1 + sp`` ranks; the ``sp - 1`` extra tile ranks of every copy (data-parallel
  copy or GEMS replica) are numbered after all the plan's ordinary device slots
  (``outcore.plan.spatial``).

Adding a dimension means adding a field here, its lowering (which ranks run which actions, in
``outcore.schedule.lower``), its cost in the simulator and its choices in the search.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from outcore.errors import FormatError, UsageError

__all__ = ["Layout", "MODES", "PLAIN", "check_depth", "check_positive", "gems_maps"]

MODES = {"mp": "MP-Basic: one replica split over the devices",
         "mast": "MAST: a second replica in reverse stage order on the same devices",
         "master": "MASTER: as many replicas as memory allows (2, 4, ...), shifted and reversed"}


def gems_maps(stages: int, replicas: int) -> tuple[tuple[int, ...], ...]:
    """Stage -> device maps: replica pairs run in opposite directions, pairs are shifted.

    Replica ``2p`` maps stage ``s`` to ``(s + shift_p) mod K`` and replica ``2p+1`` to
    ``(K - 1 - s + shift_p) mod K`` with ``shift_p = p * K / (replicas / 2)``; for two replicas
    this is GEMS MAST (device r holds stage r of A and stage K-1-r of B).
    """
    if replicas < 1:
        raise UsageError(f"replicas must be at least 1, got {replicas}")
    if replicas > 1 and replicas % 2:
        raise UsageError(f"MAST/MASTER replicas come in pairs (2, 4, ...), got {replicas}")
    K = stages
    out = []
    pairs = max(replicas // 2, 1)
    for k in range(replicas):
        shift = (k // 2) * K // pairs
        if k % 2 == 0:
            out.append(tuple((s + shift) % K for s in range(K)))
        else:
            out.append(tuple((K - 1 - s + shift) % K for s in range(K)))
    return tuple(out)


def check_depth(depth: int, dp: int, replicas: int) -> None:
    """Raise :class:`UsageError` unless sharding over ``depth`` copies fits the mesh."""
    if depth == 1:
        return
    if dp % depth:
        raise UsageError(f"--shard {depth} must divide --dp {dp}: the parameters are sharded "
                         "over depth of the data-parallel copies")
    if replicas > 1:
        raise UsageError(f"--shard {depth} shards data-parallel copies; GEMS replicas "
                         "(--parallel mast/master) are not sharded yet: use --parallel mp")


def check_positive(what: str, value: Any) -> None:
    """Raise :class:`UsageError` unless ``value`` is an integer of at least 1."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{what} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The process mesh of a plan (see the module docstring).

    Attributes:
        mode: GEMS mode: ``mp``, ``mast`` or ``master``.
        replicas: model replicas on the model-parallel devices (1 for ``mp``).
        dp: data-parallel copies of the model-parallel group.
        maps: ``maps[k][s]`` = device (within the group) of stage ``s`` of replica ``k``;
            empty for a plain (unreplicated) plan.
        tp: tensor-parallel degree inside each device of a stage.
        sp: spatial-parallel degree (image tiles) inside each device of a stage.
        depth: data-parallel copies that shard each slot's parameters among themselves
            (divides ``dp``; 1: every copy holds them whole).
    """

    mode: str = "mp"
    replicas: int = 1
    dp: int = 1
    maps: tuple[tuple[int, ...], ...] = ()
    tp: int = 1
    sp: int = 1
    depth: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown parallel mode {self.mode!r}: use {', '.join(MODES)}")
        for name in ("replicas", "dp", "tp", "sp", "depth"):
            check_positive(f"layout {name}", getattr(self, name))
        if self.maps and len(self.maps) != self.replicas:
            raise UsageError(f"the layout has {len(self.maps)} replica maps for "
                             f"{self.replicas} replicas")
        if self.mode == "mp" and self.replicas != 1:
            raise UsageError("mp has one replica; use mast or master for more")
        if self.mode == "mast" and self.replicas != 2:
            raise UsageError("mast has exactly two replicas; use master for more")
        if self.sp > 1 and self.tp > 1:
            raise UsageError(f"spatial parallelism (sp {self.sp}) with tensor parallelism is "
                             "not supported: use tp = 1 with --sp")
        if self.sp > 1 and self.depth > 1:
            raise UsageError(f"spatial parallelism (sp {self.sp}) with sharded copies (--shard "
                             f"{self.depth}) is not supported: use --shard 1 with --sp")
        check_depth(self.depth, self.dp, self.replicas)

    @property
    def replicated(self) -> bool:
        """True when the graph is copied (GEMS replicas or data parallelism)."""
        return bool(self.maps)

    @property
    def stages(self) -> int:
        return len(self.maps[0]) if self.maps else 0

    @property
    def copies(self) -> int:
        """Copies of the model that train on different micro-batches (replicas x dp)."""
        return self.replicas * self.dp

    @property
    def width(self) -> int:
        """Ranks inside one device slot of a stage (tp x sp)."""
        return self.tp * self.sp

    def ranks(self, stages: int) -> int:
        """Ranks of the whole mesh for ``stages`` model-parallel devices (the spatial stage
        of every replica has ``sp`` tile ranks: ``stages + replicas x (sp - 1)`` per
        data-parallel copy)."""
        return (stages + self.replicas * (self.sp - 1)) * self.dp * self.tp

    def describe(self) -> str:
        parts = [] if self.mode == "mp" else [f"{self.mode} x{self.replicas} replicas"]
        parts += [f"{k} {v}" for k, v in (("dp", self.dp), ("shard", self.depth),
                                          ("tp", self.tp), ("sp", self.sp)) if v > 1]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "replicas": self.replicas, "dp": self.dp,
                "maps": [list(m) for m in self.maps], "tp": self.tp, "sp": self.sp,
                "depth": self.depth}

    @staticmethod
    def from_dict(doc: Any, source: str = "plan") -> "Layout":
        if not isinstance(doc, dict):
            raise FormatError(f"{source}: 'layout' must be a JSON object")
        try:
            return Layout(mode=str(doc.get("mode", "mp")),
                          replicas=int(doc.get("replicas", 1)), dp=int(doc.get("dp", 1)),
                          maps=tuple(tuple(int(d) for d in m) for m in doc.get("maps") or ()),
                          tp=int(doc.get("tp", 1)), sp=int(doc.get("sp", 1)),
                          depth=int(doc.get("depth", 1)))
        except (TypeError, ValueError) as e:
            raise FormatError(f"{source}: unreadable layout ({e})") from None

    @staticmethod
    def replicate(mode: str, stages: int, replicas: int = 1, dp: int = 1,
                  tp: int = 1, depth: int = 1) -> "Layout":
        """The layout of ``replicas`` GEMS replicas of a ``stages``-slot split, ``dp`` times
        (sharded over ``depth`` of them), every slot ``tp`` ranks."""
        if replicas > stages and replicas > 1:
            raise UsageError(f"{replicas} replicas on {stages} devices: at most one replica per "
                             "device and direction; use data parallelism (--dp) for more")
        return Layout(mode=mode, replicas=replicas, dp=dp, maps=gems_maps(stages, replicas),
                      tp=tp, depth=depth)


PLAIN = Layout()
