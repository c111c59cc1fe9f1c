"""A wider search never finds less: every plan a narrower request finds (the layout fixed,
the micro-batches given, or both) is among the candidates of the wider one (layout and
micro-batches open), so the wider plan fits whenever a narrower one does and is no slower
(within the search's tie)."""

from __future__ import annotations

import re

import pytest

import outcore
from outcore.errors import InfeasibleError, OutcoreError
from outcore.graph.generators import make
from outcore.search.ranking import TIE

# (family, nodes, devices, memory per device as a fraction of the fair share of parameter state
# and activations): where narrower requests found plans a wider one once missed, and others
CASES = [
    ("chain", 300, 2, 0.67, "parameters offloaded: under the plain parameter floor"),
    ("chain", 300, 4, 0.67, "parameters offloaded, 4 devices"),
    ("rnn", 300, 4, 1.5, "the planners' memory model refuses a split that fits"),
    ("resnet", 300, 2, 1.5, "activations dominate"),
    ("nas", 300, 2, 1.5, "branches"),
]

NARROW = {"fixed layout, 1 micro-batch": dict(microbatches=1),
          "fixed layout, micro-batches open": dict(microbatches="auto"),
          "open layout, 1 micro-batch": dict(microbatches=1, search_layout=True)}


def _time(g, devices, memory, **kw):
    try:
        p = outcore.plan(g, devices=devices, memory=memory, **kw)
    except OutcoreError:
        return None
    return float(p.predicted["iteration_s"])


@pytest.mark.parametrize("family,nodes,devices,frac,why", CASES,
                         ids=[f"{c[0]}-K{c[2]}" for c in CASES])
def test_the_open_search_is_never_worse_than_a_narrower_one(family, nodes, devices, frac, why):
    g = make(family, nodes, seed=1)
    params, saved = float(g.param_bytes.sum()), float(g.saved_bytes.sum())
    memory = (4 * params + saved) / devices * frac
    narrow = {name: _time(g, devices, memory, **kw) for name, kw in NARROW.items()}
    wide = _time(g, devices, memory, microbatches="auto", search_layout=True)
    found = {name: t for name, t in narrow.items() if t is not None}
    assert found, f"{why}: no narrower request plans this case; it tests nothing"
    assert wide is not None, f"{why}: the open search refused what {sorted(found)} planned"
    for name, t in found.items():
        assert wide <= t * (1 + TIE), (why, name, t, wide)


def test_a_refusal_of_many_micro_batches_suggests_fewer_that_fit():
    """In flight, a pipeline holds up to a micro-batch per stage: fewer micro-batches can fit
    where more do not, and the refusal says how many (checked by planning them)."""
    g = make("chain", 300, seed=1)
    memory = float((g.param_bytes * 4 + g.saved_bytes).sum()) / 2 * 0.5
    with pytest.raises(InfeasibleError) as refused:
        outcore.plan(g, devices=2, memory=memory, microbatches=4)
    found = re.search(r"microbatches=(\d+) fits \(checked\)", str(refused.value))
    assert found, str(refused.value)
    fewer = int(found.group(1))
    assert 1 <= fewer < 4
    p = outcore.plan(g, devices=2, memory=memory, microbatches=fewer)
    assert max(p.predicted["peak_bytes"]) <= memory


@pytest.mark.parametrize("model", ["hf:gpt2:hidden_size=64",
                                   "outcore:transformer:layers=2,d_model=64,heads=4,seq=16"])
def test_a_limit_at_a_plans_own_peak_plans_it_again(model):
    """A pipeline planned without a limit, planned again under a limit equal to its own
    predicted peak (no memory policies), is found again: the placers' summary memory model put
    GPT-2's time-balanced split over that limit (its stage 0 holds the tied weight it sends
    on), and only splits shaped by the limit, which the simulator found over it, were tried."""
    g = outcore.model_graph(model, costs="estimate:cpu", batch_size=4)
    free = outcore.plan(g, 2, None, strategy="pipeline", microbatches=2, optimizer="sgd")
    peak = max(free.predicted["peak_bytes"])
    held = outcore.plan(g, 2, peak, strategy="pipeline", microbatches=2, optimizer="sgd",
                        memory_policy="none")
    assert max(held.predicted["peak_bytes"]) <= peak
    assert held.predicted["iteration_s"] <= free.predicted["iteration_s"] * (1 + TIE)
