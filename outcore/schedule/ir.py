"""The schedule IR: per-rank ordered lists of small actions (docs/runtime.md, "Schedules").

An action is forward or backward of one piece for one micro-batch, the send or receive of one
transfer's tensors (activations forward, gradients backward) for one micro-batch, a gradient
all-reduce, or the optimizer step. Each action has a compact string form, in the spirit of
torch.distributed.pipelining (``2F3`` = piece 2 forward of micro-batch 3; ``t5SF3`` = send the
forward tensors of transfer 5 for micro-batch 3; ``AR0`` = all-reduce bucket 0; ``OPT``):

    F  forward          B  backward
    SF send activations RF receive activations
    SB send gradients   RB receive gradients
    AR all-reduce       OPT optimizer step

The simulator and the runtime execute the same lists: what is predicted is what runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from outcore.errors import ScheduleError
from outcore.lazytuple import LazyTuple
from outcore.plan.pieces import Pieces

COMPUTE = ("F", "B")
SENDS = ("SF", "SB")
RECVS = ("RF", "RB")
COLLECTIVE = ("AR",)
OPS = COMPUTE + SENDS + RECVS + COLLECTIVE + ("OPT",)
# each op's number in the columns of a schedule (ActionColumns) and in the compiled simulator
OP_INDEX = {op: k for k, op in enumerate(OPS)}
# a rank posts each receive (and allocates its buffer) when it reaches the action this many
# places before it (the first ones at the start of the step), so the data flows meanwhile
RECV_POST_AHEAD = 3
# a piece's input from another piece of its rank at least this large enters it without being
# held (``outcore.core.boundary.Entry``); a smaller one becomes an autograd leaf, which the
# executor holds until the piece's backward (the memory model counts it there)
ENTRY_MIN_BYTES = 64 * 1024

_PATTERN = re.compile(r"^(?:(\d+)(F|B)(\d+)|t(\d+)(SF|RF|SB|RB)(\d+)|AR(\d+)|OPT)$")


class _Fields(NamedTuple):
    op: str
    mb: int = -1
    piece: int = -1
    transfer: int = -1
    bucket: int = -1


class Action(_Fields):
    """One step of one rank.

    Attributes:
        op: one of ``OPS``.
        mb: micro-batch (-1 for ``AR``/``OPT``).
        piece: piece id for ``F``/``B``.
        transfer: transfer id for sends and receives.
        bucket: gradient bucket for ``AR``.

    (A named tuple: a schedule of a large plan holds hundreds of thousands.)
    """

    __slots__ = ()

    def __new__(cls, op: str, mb: int = -1, piece: int = -1, transfer: int = -1,
                bucket: int = -1) -> "Action":
        if op not in OPS:
            raise ScheduleError(f"unknown action op {op!r}; expected one of {OPS}")
        return _Fields.__new__(cls, op, mb, piece, transfer, bucket)

    @classmethod
    def known(cls, op: str, mb: int, piece: int = -1, transfer: int = -1) -> "Action":
        """An action whose ``op`` the caller knows is one of ``OPS`` (not checked again: the
        schedule builder makes one per task and message)."""
        return tuple.__new__(cls, (op, mb, piece, transfer, -1))

    def __str__(self) -> str:
        if self.op in COMPUTE:
            return f"{self.piece}{self.op}{self.mb}"
        if self.op in SENDS + RECVS:
            return f"t{self.transfer}{self.op}{self.mb}"
        if self.op == "AR":
            return f"AR{self.bucket}"
        return "OPT"

    @staticmethod
    def parse(text: str) -> "Action":
        """Inverse of ``str(action)``."""
        m = _PATTERN.match(text.strip())
        if not m:
            raise ScheduleError(f"cannot read action {text!r}: expected forms like 2F3, t5SF3, "
                                "AR0, OPT")
        if m.group(2):
            return Action(m.group(2), mb=int(m.group(3)), piece=int(m.group(1)))
        if m.group(5):
            return Action(m.group(5), mb=int(m.group(6)), transfer=int(m.group(4)))
        if m.group(7):
            return Action("AR", bucket=int(m.group(7)))
        return Action("OPT")


class ActionColumns(LazyTuple):
    """One rank's actions held as columns, as the schedule builder makes them: ``op`` (the
    index of each action's op in :data:`OPS`), ``mb``, ``piece``, ``transfer``, ``bucket``
    (``int64`` arrays). Read one by one they are :class:`Action` tuples, made on first use
    (the simulator's compiled loop reads the columns); equal to the tuple of those actions,
    and pickled as it."""

    noun = "actions"

    def __init__(self, op: np.ndarray, mb: np.ndarray, piece: np.ndarray,
                 transfer: np.ndarray, bucket: np.ndarray) -> None:
        columns = (op, mb, piece, transfer, bucket)
        super().__init__(len(op), lambda: _actions_of(columns))  # (no cycle through self)
        self.columns = columns


def _actions_of(columns: tuple[np.ndarray, ...]) -> tuple[Action, ...]:
    new, ops = tuple.__new__, OPS
    return tuple(new(Action, (ops[o], m, p, t, b))
                 for o, m, p, t, b in zip(*(c.tolist() for c in columns)))


def action_columns(actions: Sequence[Action]) -> tuple[np.ndarray, ...]:
    """``(op, mb, piece, transfer, bucket)`` columns of any rank's actions (as
    :class:`ActionColumns` holds them)."""
    if isinstance(actions, ActionColumns):
        return actions.columns
    rows = [(OP_INDEX[a.op], a.mb, a.piece, a.transfer, a.bucket) for a in actions]
    if not rows:
        return tuple(np.zeros(0, np.int64) for _ in range(5))
    return tuple(np.array(c, np.int64) for c in zip(*rows))


def F(piece: int, mb: int) -> Action:
    return Action("F", mb=mb, piece=piece)


def B(piece: int, mb: int) -> Action:
    return Action("B", mb=mb, piece=piece)


@dataclass(frozen=True, eq=False)
class Schedule:
    """Per-rank action lists over the pieces of a placed graph.

    Attributes:
        kind: the builder (``gpipe``, ``1f1b``).
        num_ranks: ranks that take part (a rank may have an empty list).
        microbatches: micro-batches per iteration.
        pieces: the cut of the placed graph (pieces and transfers; ``piece.device`` is its rank).
        actions: ``actions[r]`` is rank ``r``'s ordered list (a tuple of actions, or the
            :class:`ActionColumns` the builder makes).
        buckets: for each ``AR`` bucket, the ranks that take part (empty: no all-reduce).
        meta: builder parameters (in-flight limits, micro-batch scale, ...).
    """

    kind: str
    num_ranks: int
    microbatches: int
    pieces: Pieces
    actions: tuple[Sequence[Action], ...]
    buckets: tuple[tuple[int, ...], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def rank_of_piece(self, piece: int) -> int:
        return self.pieces.pieces[piece].device

    def rank_of_transfer_src(self, transfer: int) -> int:
        return self.pieces.transfer_devices[transfer][0]

    def rank_of_transfer_dst(self, transfer: int) -> int:
        return self.pieces.transfer_devices[transfer][1]

    def peer(self, rank: int, a: Action) -> int:
        """The other rank of a send or receive executed by ``rank``."""
        src, dst = self.pieces.transfer_devices[a.transfer]
        return dst if rank == src else src

    def pair_partner(self, bucket: int, rank: int) -> int | None:
        """The other rank of a two-rank ``bucket`` that ``rank`` may sum it with over a link
        of their own (:class:`outcore.core.comm.PairSum`), or None: no message of the
        schedule passes between the two (the sums cannot interleave with them), and both
        start the buckets they share in one order (a link is read in the order it was
        written). Both ranks decide alike; the runtime and the simulator ask this."""
        ranks = sorted(self.buckets[bucket])
        if len(ranks) != 2 or rank not in ranks:
            return None
        other = ranks[0] if ranks[1] == rank else ranks[1]
        if any(a.op in ("SF", "SB", "RF", "RB") and self.peer(rank, a) == other
               for a in self.actions[rank]):
            return None

        def order(r: int) -> list[int]:
            return [a.bucket for a in self.actions[r]
                    if a.op == "AR" and sorted(self.buckets[a.bucket]) == ranks]
        return other if order(rank) == order(other) else None

    def format(self) -> str:
        """The schedule as a table: one line per rank, actions by their string form."""
        width = max((len(str(a)) for acts in self.actions for a in acts), default=3)
        lines = []
        for r, acts in enumerate(self.actions):
            lines.append(f"rank {r}: " + " ".join(str(a).rjust(width) for a in acts))
        return "\n".join(lines)
