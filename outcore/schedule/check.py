"""Checks on a schedule: every task exactly once, local order, matched messages, no deadlock.

Invalid schedules fail with :class:`ScheduleError` naming the rank, the action and the rule,
never with a bare assertion.
"""

from __future__ import annotations

from collections import Counter

from outcore.errors import ScheduleError
from outcore.schedule.ir import Action, Schedule


def check(s: Schedule) -> None:
    """Raise :class:`ScheduleError` on the first violated rule; see module docstring."""
    _check_tasks(s)
    _check_local_order(s)
    _check_messages(s)
    _check_progress(s)


def _check_tasks(s: Schedule) -> None:
    seen: Counter = Counter()
    for r, acts in enumerate(s.actions):
        for a in acts:
            if a.op in ("F", "B"):
                if not 0 <= a.piece < len(s.pieces.pieces):
                    raise ScheduleError(f"rank {r}: {a} names piece {a.piece}, which does not "
                                        "exist")
                if s.rank_of_piece(a.piece) != r:
                    raise ScheduleError(f"rank {r}: {a} runs piece {a.piece}, which is placed on "
                                        f"rank {s.rank_of_piece(a.piece)}")
                if not 0 <= a.mb < s.microbatches:
                    raise ScheduleError(f"rank {r}: {a} names micro-batch {a.mb} of "
                                        f"{s.microbatches}")
                seen[(a.op, a.piece, a.mb)] += 1
    for p in s.pieces.pieces:
        for m in range(s.microbatches):
            for op in ("F", "B"):
                k = seen[(op, p.id, m)]
                if k != 1:
                    raise ScheduleError(f"rank {p.device}: {Action(op, mb=m, piece=p.id)} appears "
                                        f"{k} times; every forward and backward must run once")


def _check_local_order(s: Schedule) -> None:
    for r, acts in enumerate(s.actions):
        pos = {str(a): i for i, a in enumerate(acts)}
        for i, a in enumerate(acts):
            if a.op == "B":
                f = pos.get(f"{a.piece}F{a.mb}")
                if f is None or f > i:
                    raise ScheduleError(f"rank {r}: {a} comes before its forward {a.piece}F{a.mb}")


def _check_messages(s: Schedule) -> None:
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for r, acts in enumerate(s.actions):
        for a in acts:
            if a.op in ("SF", "SB", "RF", "RB"):
                if not 0 <= a.transfer < len(s.pieces.transfers):
                    raise ScheduleError(f"rank {r}: {a} names transfer {a.transfer}, which does "
                                        "not exist")
                t = s.pieces.transfers[a.transfer]
                if t.local:
                    raise ScheduleError(f"rank {r}: {a} sends a transfer that stays on one rank")
                src, dst = s.rank_of_transfer_src(a.transfer), s.rank_of_transfer_dst(a.transfer)
                sender = src if a.op in ("SF", "RB") else dst
                expected = sender if a.op in ("SF", "SB") else (dst if a.op == "RF" else src)
                if r != expected:
                    raise ScheduleError(f"rank {r}: {a} belongs on rank {expected}")
                direction = "F" if a.op in ("SF", "RF") else "B"
                (sends if a.op.startswith("S") else recvs)[(a.transfer, direction, a.mb)] += 1
    for key in set(sends) | set(recvs):
        if sends[key] != 1 or recvs[key] != 1:
            t, d, m = key
            raise ScheduleError(f"transfer {t} ({'activations' if d == 'F' else 'gradients'}) of "
                                f"micro-batch {m} is sent {sends[key]} times and received "
                                f"{recvs[key]} times; each must happen once")
    for t in s.pieces.transfers:
        if t.local:
            continue
        for m in range(s.microbatches):
            for d in ("F", "B"):
                if sends[(t.id, d, m)] != 1:
                    raise ScheduleError(f"transfer {t.id} of micro-batch {m} is never sent "
                                        f"({'activations' if d == 'F' else 'gradients'})")


def _check_progress(s: Schedule) -> None:
    """Replay with blocking receives, asynchronous sends and collective all-reduces; a state
    where no rank can move is a deadlock."""
    pc = [0] * s.num_ranks
    sent: set[tuple[int, str, int]] = set()
    received: set[tuple[int, str, int]] = set()
    done_compute: set[tuple[str, int, int]] = set()
    ar_waiting: dict[int, set[int]] = {}
    total = sum(len(a) for a in s.actions)
    executed = 0
    while executed < total:
        moved = False
        for r in range(s.num_ranks):
            while pc[r] < len(s.actions[r]):
                a = s.actions[r][pc[r]]
                if a.op in ("RF", "RB"):
                    if (a.transfer, a.op[1], a.mb) not in sent:
                        break
                    received.add((a.transfer, a.op[1], a.mb))
                elif a.op in ("F", "B"):
                    if not _inputs_done(s, a, done_compute, received):
                        raise ScheduleError(f"rank {r}: {a} runs before a local input is ready "
                                            "(missing receive, or wrong order of local pieces)")
                    done_compute.add((a.op, a.piece, a.mb))
                elif a.op in ("SF", "SB"):
                    sent.add((a.transfer, a.op[1], a.mb))
                elif a.op == "AR":  # launched asynchronously; the optimizer step waits for it
                    ar_waiting.setdefault(a.bucket, set()).add(r)
                elif a.op == "OPT":
                    mine = [b for b, grp in enumerate(s.buckets) if r in grp]
                    if not all(set(s.buckets[b]) <= ar_waiting.get(b, set()) for b in mine):
                        break
                pc[r] += 1
                executed += 1
                moved = True
        if not moved:
            stuck = [f"rank {r} at {s.actions[r][pc[r]]}" for r in range(s.num_ranks)
                     if pc[r] < len(s.actions[r])]
            raise ScheduleError("the schedule deadlocks: " + "; ".join(stuck[:6]))


def _inputs_done(s: Schedule, a: Action, done: set[tuple[str, int, int]],
                 received: set[tuple[int, str, int]]) -> bool:
    """Whether every input of a compute action has been produced locally or received."""
    P = s.pieces
    if a.op == "F":
        return all(("F", P.transfers[t].src, a.mb) in done if P.transfers[t].local
                   else (t, "F", a.mb) in received for t in P.inputs_of[a.piece])
    if ("F", a.piece, a.mb) not in done:
        return False
    return all(("B", P.transfers[t].dst, a.mb) in done if P.transfers[t].local
               else (t, "B", a.mb) in received for t in P.outputs_of[a.piece])
