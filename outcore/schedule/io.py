"""The schedule's JSON form, ``outcore-schedule/1`` (no torch).

``outcore plan --schedule-out s.json`` writes the schedule a plan lowers to; ``outcore simulate``
and ``outcore train`` read it back with ``--schedule-file``: the file's action lists are run in
place of the freshly built ones, after checking that the file was made for the same pieces (node
names, ranks, transfers, all-reduce buckets) and that its lists are a valid schedule. A person can
read the file (one line of compact actions per rank, as :meth:`Schedule.format` prints them) and
may reorder actions by hand; the check refuses orders that would deadlock.

    {"format": "outcore-schedule/1", "kind": "1f1b", "ranks": 2, "microbatches": 2,
     "pieces": [{"id": 0, "rank": 0, "nodes": ["x", "fc1"]}, ...],
     "transfers": [{"id": 0, "src": 0, "dst": 1, "tensors": ["fc1"], "bytes": 512}],
     "buckets": [{"ranks": [0, 1], "params": ["w"]}],
     "actions": ["0F0 t0SF0 0F1 t0SF1 t0RB0 0B0 ...", "..."]}
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from outcore.errors import FormatError, ScheduleError
from outcore.jsonfile import read_json, write_json
from outcore.schedule.check import check
from outcore.schedule.ir import Action, Schedule
from outcore.schedule.lower import Lowered

FORMAT = "outcore-schedule/1"

__all__ = ["FORMAT", "adopt", "describe", "load", "save", "to_dict"]


def to_dict(low: Lowered) -> dict[str, Any]:
    """The JSON form of a lowered plan's schedule (names from the executed graph)."""
    s, g = low.schedule, low.graph
    name = g.name_of
    return {
        "format": FORMAT, "kind": s.kind, "ranks": s.num_ranks, "microbatches": s.microbatches,
        "copies": low.copies,
        "pieces": [{"id": p.id, "rank": p.device, "group": p.group,
                    "nodes": [name(v) for v in p.nodes]} for p in s.pieces.pieces],
        "transfers": [{"id": t.id, "src": t.src, "dst": t.dst,
                       "tensors": [name(v) for v in t.tensors], "bytes": int(t.bytes),
                       "local": bool(t.local)} for t in s.pieces.transfers],
        "buckets": [{"ranks": list(group), "params": list(params)} for group, params in
                    zip(s.buckets, s.meta.get("bucket_params", ()))],
        "actions": [" ".join(str(a) for a in acts) for acts in s.actions],
    }


def save(low: Lowered, path: str | os.PathLike) -> Path:
    return write_json(path, to_dict(low))


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A schedule file's document (checked against a lowered plan by :func:`adopt`)."""
    doc = read_json(path, "schedule file")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise FormatError(f"{path}: format is {got!r}, expected {FORMAT!r} (schedules come from"
                          " `outcore plan --schedule-out`)")
    doc["_source"] = str(path)
    return doc


def adopt(low: Lowered, doc: dict[str, Any]) -> Lowered:
    """``low`` running the action lists of schedule document ``doc``.

    Raises :class:`ScheduleError` when ``doc`` was made for other pieces, ranks, transfers or
    buckets than ``low`` (another plan, model or micro-batch count), or when its lists are not
    a valid schedule (see :func:`outcore.schedule.check.check`).
    """
    source = doc.get("_source", "the schedule file")
    mine = to_dict(low)
    for key in ("ranks", "microbatches", "copies", "pieces", "transfers", "buckets"):
        if _structure(key, doc.get(key)) != _structure(key, mine[key]):
            raise ScheduleError(f"{source} was made for other {key} than this plan lowers to "
                                f"(file: {_short(doc.get(key))}; plan: {_short(mine[key])}): "
                                "write it again with `outcore plan --schedule-out`")
    lists = doc.get("actions")
    if not isinstance(lists, list) or len(lists) != low.schedule.num_ranks:
        raise ScheduleError(f"{source}: 'actions' needs one line per rank "
                            f"({low.schedule.num_ranks})")
    actions = tuple(tuple(Action.parse(t) for t in str(line).split()) for line in lists)
    s: Schedule = replace(low.schedule, actions=actions,
                          meta={**low.schedule.meta, "source": source})
    check(s)
    return replace(low, schedule=s)


def describe(low: Lowered) -> str:
    """The schedule as text a person checks by eye: pieces, transfers, buckets, then one line
    of actions per rank (the golden files of ``tests/schedule/golden`` are in this form)."""
    s, name = low.schedule, low.graph.name_of
    lines = [f"{s.kind}, {s.num_ranks} ranks, {s.microbatches} micro-batches, "
             f"{low.copies} cop{'y' if low.copies == 1 else 'ies'}"]
    lines += [f"piece {p.id} on rank {p.device}: {' '.join(name(v) for v in p.nodes)}"
              for p in s.pieces.pieces]
    lines += [f"transfer {t.id}: piece {t.src} -> piece {t.dst} "
              f"({' '.join(name(v) for v in t.tensors)}{', local' if t.local else ''})"
              for t in s.pieces.transfers]
    lines += [f"bucket {b}: ranks {list(group)}: {' '.join(params)}" for b, (group, params)
              in enumerate(zip(s.buckets, s.meta.get("bucket_params", ())))]
    return "\n".join(lines + [s.format()]) + "\n"


def _structure(key: str, value: Any) -> Any:
    """What must match between a schedule file and a plan: transfer sizes depend on the batch
    the graph was captured at, so they are left out."""
    if key == "transfers" and isinstance(value, list):
        return [{k: v for k, v in t.items() if k != "bytes"} if isinstance(t, dict) else t
                for t in value]
    return value


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
