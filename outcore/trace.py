"""Timelines: what ran where and when, predicted (simulator) or measured (runtime).

Both the simulator and the runtime produce a :class:`Timeline`, so the same code draws a Gantt
chart and writes a Chrome trace for either, and two timelines can be merged side by side.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from outcore.lazytuple import LazyTuple


class Event(NamedTuple):
    """One action on one rank.

    ``stream`` is ``compute`` or ``comm``; ``kind`` is ``F``, ``B``, ``send``, ``recv``,
    ``allreduce``, ``optim``, ``offload``, ``prefetch``, ``recompute``, ...; ``label`` is the
    action's string form (``2F3``). (A named tuple: a simulation of a large plan makes hundreds
    of thousands; ``_replace`` and ``_asdict`` as for any.)
    """

    rank: int
    kind: str
    label: str
    start_s: float
    end_s: float
    stream: str = "compute"
    mb: int = -1
    piece: int = -1
    bytes: int = 0
    peer: int = -1  # the other rank of a send or receive

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class EventColumns(LazyTuple):
    """A timeline's events held as columns (``rank``, ``start_s``, ``end_s``, ``bytes``,
    ``piece``; and ``compute``, ``fb``, ``forward``, ``sent``: on the compute stream, a forward
    or backward, a forward, a send or all-reduce), as the compiled simulator makes them;
    read one by one they are :class:`Event` tuples, made on first use (``make``) — a search
    reads only the columns."""

    noun = "events"

    def __init__(self, columns: dict[str, np.ndarray], make: Callable[[], tuple[Event, ...]]
                 ) -> None:
        super().__init__(len(columns["rank"]), make)
        self.columns = columns


def event_columns(events: Iterable[Event]) -> dict[str, np.ndarray]:
    """:class:`EventColumns`' columns of any events, in their order."""
    ev = list(events)
    return {"rank": np.array([e.rank for e in ev], np.int64),
            "start_s": np.array([e.start_s for e in ev], np.float64),
            "end_s": np.array([e.end_s for e in ev], np.float64),
            "bytes": np.array([e.bytes for e in ev], np.int64),
            "compute": np.array([e.stream == "compute" for e in ev], np.bool_),
            "fb": np.array([e.kind in ("F", "B") for e in ev], np.bool_),
            "forward": np.array([e.kind == "F" for e in ev], np.bool_),
            "piece": np.array([e.piece for e in ev], np.int64),
            "sent": np.array([e.kind in ("send", "allreduce") for e in ev], np.bool_)}


@dataclass(frozen=True, eq=False)
class Timeline:
    """Events of one iteration, plus memory over time per rank.

    ``memory[r]`` is ``(times_s, bytes)``: allocated bytes on rank ``r`` from each time on.
    """

    num_ranks: int
    events: tuple[Event, ...]
    iteration_s: float
    memory: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    memory_limit_bytes: float | None = None
    source: str = "simulated"
    meta: dict[str, Any] = field(default_factory=dict)

    def columns(self) -> dict[str, np.ndarray]:
        """The events as columns (:class:`EventColumns`), in their order (made once)."""
        return self._columns

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        if isinstance(self.events, EventColumns):
            return self.events.columns
        return event_columns(self.events)

    def busy_s(self) -> np.ndarray:
        """Compute-busy seconds per rank (summed in the events' order)."""
        c = self.columns()
        busy = np.zeros(self.num_ranks)
        on = c["compute"]
        np.add.at(busy, c["rank"][on], c["end_s"][on] - c["start_s"][on])
        return busy

    def peak_bytes(self) -> np.ndarray:
        """Peak allocated bytes per rank (0 where memory was not tracked)."""
        out = np.zeros(self.num_ranks)
        for r, (_, b) in enumerate(self.memory):
            if len(b):
                out[r] = float(np.max(b))
        return out

    def comm_bytes(self) -> np.ndarray:
        """Bytes sent per rank."""
        c = self.columns()
        out = np.zeros(self.num_ranks)
        np.add.at(out, c["rank"][c["sent"]], c["bytes"][c["sent"]])
        return out


def to_chrome_trace(timelines: Iterable[Timeline], names: Iterable[str] | None = None
                    ) -> dict[str, Any]:
    """A Chrome/Perfetto trace; several timelines become several processes side by side.

    Each timeline is a process (``pid``), each rank × stream a thread; memory is a counter track.
    """
    timelines = list(timelines)
    labels = list(names) if names is not None else [t.source for t in timelines]
    events: list[dict[str, Any]] = []
    for pid, (tl, label) in enumerate(zip(timelines, labels)):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}})
        for r in range(tl.num_ranks):
            for k, stream in enumerate(("compute", "comm")):
                tid = 2 * r + k
                events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                               "args": {"name": f"rank {r} {stream}"}})
        for e in tl.events:
            events.append({
                "ph": "X", "pid": pid, "tid": 2 * e.rank + (e.stream == "comm"),
                "name": e.label, "cat": e.kind, "ts": e.start_s * 1e6,
                "dur": max(e.duration_s, 0.0) * 1e6,
                "args": {"mb": e.mb, "piece": e.piece, "bytes": e.bytes, "peer": e.peer},
            })
        for r, (times, values) in enumerate(tl.memory):
            for t, v in zip(np.asarray(times).tolist(), np.asarray(values).tolist()):
                events.append({"ph": "C", "pid": pid, "name": f"memory rank {r}", "ts": t * 1e6,
                               "args": {"MiB": v / 2**20}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(path: str | os.PathLike, timelines: Iterable[Timeline],
                      names: Iterable[str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(timelines, names)))
    return path


def save_events(path: str | os.PathLike, tl: Timeline) -> Path:
    """Write a timeline's events and memory as JSON (read back by :func:`load_events`)."""
    doc = {"format": "outcore-timeline/1", "num_ranks": tl.num_ranks,
           "iteration_s": tl.iteration_s, "source": tl.source,
           "memory_limit_bytes": tl.memory_limit_bytes, "meta": tl.meta,
           "events": [e._asdict() for e in tl.events],
           "memory": [[np.asarray(t).tolist(), np.asarray(b).tolist()] for t, b in tl.memory]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def load_events(path: str | os.PathLike) -> Timeline:
    doc = json.loads(Path(path).read_text())
    return Timeline(num_ranks=doc["num_ranks"], events=tuple(Event(**e) for e in doc["events"]),
                    iteration_s=doc["iteration_s"],
                    memory=tuple((np.asarray(t), np.asarray(b)) for t, b in doc["memory"]),
                    memory_limit_bytes=doc.get("memory_limit_bytes"),
                    source=doc.get("source", "simulated"), meta=doc.get("meta", {}))


COMM_KINDS = ("send", "recv", "allreduce", "allgather", "reduce_scatter", "broadcast",
              "offload", "prefetch")


def with_inner_collectives(tl: Timeline,
                           collectives: dict[int, tuple[tuple[str, str, float, float], ...]]
                           | None) -> Timeline:
    """``tl`` with the collectives pieces run inside their forward or backward
    (:attr:`outcore.schedule.costs.PieceCosts.collectives`) as ``comm`` events, one after
    another from the start of each forward / backward that runs them (their time is part of
    that action's), so the communication profile can set them beside the measured ones."""
    if not collectives:
        return tl
    extra = []
    for e in tl.events:
        if e.kind not in ("F", "B") or e.piece not in collectives:
            continue
        t = e.start_s
        for phase, kind, nbytes, secs in collectives[e.piece]:
            if phase == e.kind:
                extra.append(Event(e.rank, kind, kind, t, t + secs, "comm", e.mb, e.piece,
                                   int(nbytes)))
                t += secs
    if not extra:
        return tl
    events = tuple(sorted([*tl.events, *extra], key=lambda e: e.start_s))
    return replace(tl, events=events)


def comm_profile(measured: Timeline, predicted: Timeline | None = None) -> list[dict[str, Any]]:
    """Per communication kind (send, recv, all-reduce, ...): count, bytes, measured seconds and
    achieved bandwidth, beside the predicted timeline's seconds and bandwidth for the same kind
    (the link model's prediction for the same actions). Horovod's timeline habit (hvprof):
    show which link or collective the model gets wrong. A receive's time includes its wait.
    A measured event without a byte count takes the bytes of the predicted event of the same
    rank and label (the runtime runs the actions the simulator predicted)."""
    known = {(e.rank, e.label): e.bytes for e in predicted.events} if predicted else {}

    def totals(tl: Timeline) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for e in tl.events:
            if e.kind in COMM_KINDS or (e.stream == "comm" and e.kind not in ("F", "B")):
                t = out.setdefault(e.kind, [0, 0.0, 0.0])
                t[0] += 1
                t[1] += e.bytes or known.get((e.rank, e.label), 0)
                t[2] += e.duration_s
        return out

    meas = totals(measured)
    pred = totals(predicted) if predicted is not None else {}
    rows = []
    for kind in sorted(set(meas) | set(pred)):
        n, nbytes, secs = meas.get(kind, [0, 0.0, 0.0])
        pn, pbytes, psecs = pred.get(kind, [0, 0.0, 0.0])
        rows.append({"kind": kind, "count": int(n), "bytes": int(nbytes), "measured_s": secs,
                     "measured_bandwidth": nbytes / secs if secs > 0 else None,
                     "predicted_count": int(pn) if kind in pred else None,
                     "predicted_bytes": int(pbytes) if kind in pred else None,
                     "predicted_s": psecs if kind in pred else None,
                     "predicted_bandwidth": pbytes / psecs if psecs > 0 else None})
    return rows
