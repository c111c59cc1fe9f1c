"""The search with tensor parallelism: --tp N plans device slots of N ranks, --tp auto picks the
degree, and a layer too big for one device is planned with tp instead of being refused."""

from __future__ import annotations

import pytest

import outcore
from outcore.errors import InfeasibleError, UsageError
from outcore.plan.request import PlanRequest

# an LM whose embedding (8192 x 128 fp32 = 4 MiB; 16 MiB with Adam's state) alone exceeds the
# 14 MiB per-device limit: no split between layers can fit it
BIG_VOCAB = "outcore:transformer:vocab=8192,d_model=128,layers=1,heads=4,seq=16"


@pytest.fixture(scope="module")
def lm():
    return outcore.model_graph(BIG_VOCAB, batch_size=4, costs="estimate")


def test_a_layer_too_big_for_a_device_is_refused_without_tp(lm):
    with pytest.raises(InfeasibleError, match="alone needs"):
        outcore.plan(lm, 4, "14MiB", tp=1)


def test_tp_auto_splits_the_big_layer_and_fits(lm):
    p = outcore.plan(lm, 4, "14MiB", tp=None)
    assert p.layout.tp in (2, 4) and p.devices == 4
    assert max(p.predicted["peak_bytes"]) <= 14 * 2**20
    assert any(n.startswith("--tp auto: chose tp") for n in p.notes)
    assert any(n.startswith("tp 1:") and "alone needs" in n for n in p.notes)


def test_tp_plan_has_slots_of_tp_ranks(lm):
    p = outcore.plan(lm, 4, "14MiB", tp=2)
    assert p.layout.tp == 2 and p.devices == 4
    assert p.stages == 2 and int(p.assignment.max()) <= 1
    # one prediction per slot, and the simulator's what-if agrees with the plan's own
    assert len(p.predicted["peak_bytes"]) == 2
    again = outcore.simulate(outcore.with_tensor_parallel(p, 2), lm)
    assert again.iteration_s == pytest.approx(p.predicted["iteration_s"])


def test_tp_must_divide_the_devices():
    with pytest.raises(UsageError, match="--tp 3 must divide"):
        PlanRequest.make(4, tp=3)
    assert PlanRequest.make(8, dp=2, tp=None).tp_options() == [1, 2, 4]


def test_tp_plans_models_captured_through_torch_export():
    """An exported Llama's q/k/v -> o and gate/up -> down pairs are found on its ATen graph
    (weights read as ``param`` nodes), costed split, and planned at tp 2."""
    pytest.importorskip("transformers")
    g = outcore.model_graph("hf:llama", costs="estimate")
    assert g.meta["capture"]["path"] == "export"
    p = outcore.plan(g, 2, tp=2)
    assert p.layout.tp == 2 and p.devices == 2
    from outcore.cost.tensor import tensor_graph
    from outcore.hardware.spec import LinkSpec
    tg, layout = tensor_graph(g, 2, LinkSpec(bandwidth=1e9, latency_s=0.0))
    assert len(layout.pairs) == 4 and sum(1 for q in layout.pairs if q.heads) == 2
    # the weights sit on param nodes: those of the split projections are halved
    q_proj = [i for i in range(g.num_nodes) if g.op_of(i) == "param"
              and g.module_of(i) == "model.layers.0.self_attn.q_proj"]
    assert q_proj and all(tg.param_bytes[i] * 2 == g.param_bytes[i] for i in q_proj)


def test_the_layout_search_chooses_tp_where_nothing_else_fits(lm):
    """With the layout open (and --tp not given), the layout search enumerates tensor-parallel
    degrees beside dp, GEMS modes and micro-batches: the big embedding only fits split."""
    p = outcore.plan(lm, 4, "14MiB", tp=None, microbatches="auto", search_layout=True)
    assert p.layout.tp in (2, 4) and max(p.predicted["peak_bytes"]) <= 14 * 2**20
    tps = {r["tp"] for r in p.extra["candidates"]}
    assert tps == {1, 2, 4}
    # tp 1 layouts were planned and refused (the layer alone does not fit), not skipped
    plain = [r for r in p.extra["candidates"] if r["tp"] == 1]
    assert plain and all(r["outcome"] != "chosen" for r in plain)
    assert any("alone needs" in r["outcome"] or "memory floor" in r["outcome"]
               for r in plain)
    chosen = [r for r in p.extra["candidates"] if r["outcome"] == "chosen"]
    assert chosen[0]["tp"] == p.layout.tp


def test_the_layout_search_keeps_the_given_tp(lm):
    p = outcore.plan(lm, 4, "14MiB", tp=2, microbatches="auto", search_layout=True)
    assert p.layout.tp == 2 and {r["tp"] for r in p.extra["candidates"]} == {2}


def test_the_layout_search_notes_degrees_no_layer_splits_into():
    """A graph with no Linear / Embedding: tp > 1 is not a layout of it; the search says so in
    its notes and plans the plain layouts."""
    from outcore.graph.generators import make
    g = make("rnn", 200, seed=1).replace(batch_size=8)
    p = outcore.plan(g, 4, None, tp=None, microbatches="auto", search_layout=True)
    assert p.layout.tp == 1 and {r["tp"] for r in p.extra["candidates"]} == {1}
    assert any(n.startswith("--tp 2: no layer") for n in p.notes)


def test_a_tensor_parallel_plan_notes_the_row_x_column_grid(lm):
    """A tp 4 plan's notes price its largest pair's collectives on the 1-D layout beside the
    best grid; on a flat cluster (one link) 1-D moves the fewest bytes, so no grid wins."""
    p = outcore.plan(lm, 4, "16MiB", tp=4)
    notes = [n for n in p.notes if n.startswith("tensor grid:")]
    assert len(notes) == 1 and "(1 x 4)" in notes[0]
    assert "no row x column grid moves them faster" in notes[0]
    # tp 2 has no grid but 1 x 2 and 2 x 1: no note
    assert not any(n.startswith("tensor grid:") for n in outcore.plan(lm, 4, "16MiB", tp=2).notes)


def test_a_tensor_parallel_plan_on_one_slot_starts_only_its_ranks(lm):
    """A tp 2 plan on 4 devices that keeps every node on slot 0 runs on 2 workers, not 4,
    and says so."""
    import numpy as np

    from outcore.job import _only_used_devices
    from outcore.plan.layout import Layout
    from outcore.plan.plan import make_plan

    p = make_plan(lm, np.zeros(lm.num_nodes, dtype=np.int64), strategy="manual", devices=4,
                  memory_bytes=None, microbatches=1, layout=Layout(tp=2))
    small = _only_used_devices(lm, p, None)
    assert small.devices == 2 and small.layout.tp == 2
    assert any("uses 2 of 4 devices" in n for n in small.notes)
    assert small.predicted["iteration_s"] > 0
    both = make_plan(lm, np.arange(lm.num_nodes) * 2 // lm.num_nodes, strategy="manual",
                     devices=4, memory_bytes=None, microbatches=1, layout=Layout(tp=2))
    assert _only_used_devices(lm, both, None) is both
