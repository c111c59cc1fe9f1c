"""Lowered schedules against golden files, and the schedule file's round trip.

Each golden file in ``golden/`` is the text of :func:`outcore.schedule.io.describe`: the pieces,
transfers and all-reduce buckets, then one line of actions per rank, laid out so a reader can
check the order by eye (``2F1`` = forward of piece 2 for micro-batch 1, ``t0SF1`` = send the
activations of transfer 0 for micro-batch 1, ``AR0`` = all-reduce bucket 0). After a deliberate
change to the builders, rewrite them with ``OUTCORE_UPDATE_GOLDEN=1 pytest tests/schedule`` and
read the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from outcore.errors import ScheduleError
from outcore.graph import build as gbuild
from outcore.plan import Layout, make_plan
from outcore.schedule import io as schedule_io
from outcore.schedule.lower import lower

GOLDEN = Path(__file__).with_name("golden")


def chain(n: int, params: bool = False):
    attrs = [{"params": [f"w{i}"]} for i in range(n)] if params else None
    return gbuild("chain", fwd_s=[1.0] * n, bwd_s=[2.0] * n, src=list(range(n - 1)),
                  dst=list(range(1, n)), edge_bytes=[8] * (n - 1),
                  param_bytes=[16] * n if params else None,
                  names=[f"l{i}" for i in range(n)], attrs=attrs, batch_size=1)


def cases():
    skip = gbuild("skip", fwd_s=[1.0, 1.0, 1.0], bwd_s=[2.0, 2.0, 2.0], src=[0, 1, 0],
                  dst=[1, 2, 2], edge_bytes=[8, 8, 8], names=["a", "b", "c"], batch_size=1)
    tied = gbuild("tied", fwd_s=[1.0, 1.0, 1.0], bwd_s=[2.0, 2.0, 2.0], src=[0, 1],
                  dst=[1, 2], edge_bytes=[8, 8], names=["embed", "mid", "head"],
                  param_bytes=[16, 0, 0], batch_size=1,
                  attrs=[{"params": ["emb.weight"]}, {}, {"shared_params": ["emb.weight"]}])
    return {
        "pipeline_1f1b_3x3": (chain(3), dict(assignment=[0, 1, 2], devices=3,
                                             microbatches=3, schedule="1f1b")),
        "pipeline_gpipe_2x2": (chain(4), dict(assignment=[0, 0, 1, 1], devices=2,
                                              microbatches=2, schedule="gpipe")),
        "skip_connection_2x2": (skip, dict(assignment=[0, 1, 0], devices=2, microbatches=2,
                                           schedule="1f1b")),
        "tied_weights_2x1": (tied, dict(assignment=[0, 1, 1], devices=2, microbatches=1,
                                        schedule="1f1b")),
        "mast_2x1": (chain(2, params=True),
                     dict(assignment=[0, 1], devices=2, microbatches=1, schedule="1f1b",
                          layout=Layout.replicate("mast", 2, 2, 1))),
    }


def lowered(name: str):
    g, spec = cases()[name]
    spec = dict(spec)
    p = make_plan(g, np.array(spec.pop("assignment")), strategy="manual",
                  memory_bytes=None, **spec)
    return lower(g, p)


@pytest.mark.parametrize("name", sorted(cases()))
def test_schedule_matches_golden_file(name):
    text = schedule_io.describe(lowered(name))
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("OUTCORE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with OUTCORE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from {path}"


def test_schedule_file_round_trip(tmp_path):
    low = lowered("skip_connection_2x2")
    doc = schedule_io.load(schedule_io.save(low, tmp_path / "s.json"))
    back = schedule_io.adopt(low, doc)
    assert back.schedule.actions == low.schedule.actions
    assert back.schedule.meta["source"] == str(tmp_path / "s.json")


def test_schedule_file_reordered_by_hand_runs_that_order():
    """Both ranks may run micro-batch 1's backward before micro-batch 0's."""
    low = lowered("pipeline_gpipe_2x2")
    doc = schedule_io.to_dict(low)
    acts = doc["actions"][1].split()
    b0, b1 = acts.index("1B0"), acts.index("1B1")
    acts[b0], acts[b1] = acts[b1], acts[b0]
    sends = [k for k, a in enumerate(acts) if a.startswith("t0SB")]
    acts[sends[0]], acts[sends[1]] = acts[sends[1]], acts[sends[0]]
    doc["actions"][1] = " ".join(acts)
    r0 = doc["actions"][0].split()
    ra, rb = r0.index("t0RB0"), r0.index("t0RB1")
    r0[ra], r0[rb] = r0[rb], r0[ra]
    ba, bb = r0.index("0B0"), r0.index("0B1")
    r0[ba], r0[bb] = r0[bb], r0[ba]
    doc["actions"][0] = " ".join(r0)
    back = schedule_io.adopt(low, doc)
    assert [str(a) for a in back.schedule.actions[1]] == acts


def test_schedule_file_for_other_pieces_or_a_deadlock_is_refused():
    low = lowered("pipeline_1f1b_3x3")
    doc = schedule_io.to_dict(low)
    other = dict(doc, microbatches=2)
    with pytest.raises(ScheduleError, match="other microbatches"):
        schedule_io.adopt(low, other)
    moved = dict(doc, pieces=[dict(p, rank=0) for p in doc["pieces"]])
    with pytest.raises(ScheduleError, match="other pieces"):
        schedule_io.adopt(low, moved)
    acts = doc["actions"][1].split()
    first_recv = next(k for k, a in enumerate(acts) if a.startswith("t0RF"))
    acts.append(acts.pop(first_recv))  # rank 1 computes before its input arrives
    with pytest.raises(ScheduleError):
        schedule_io.adopt(low, dict(doc, actions=[doc["actions"][0], " ".join(acts),
                                                  doc["actions"][2]]))
