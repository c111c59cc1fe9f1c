"""In-place writes in a traced graph: later readers of a written tensor read the writing op."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

from outcore.graph.capture import trace
from outcore.graph.capture.mutation import setitem_, thread_in_place, writes_first_arg


class DropPathLike(nn.Module):
    """timm's DropPath: the mask is divided in place, then read by its original name."""

    def forward(self, x):
        r = x.new_empty((x.shape[0], 1)).bernoulli_(0.5)
        r.div_(0.5)
        return x * r


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name or n.target == name)


def test_a_reader_after_an_in_place_write_reads_the_write():
    gm = trace(DropPathLike()).gm
    div = _node(gm, "div_")
    mul = next(n for n in gm.graph.nodes if n.target is operator.mul)
    assert div in mul.args and _node(gm, "bernoulli_") not in mul.args
    torch.manual_seed(0)
    x = torch.ones(64, 3)
    out = gm(x)  # the module still runs: every row is 0 or 2 (the divided mask)
    assert set(out.unique().tolist()) <= {0.0, 2.0} and (out == 2).any()


def test_readers_before_a_write_are_left_alone_and_setitem_is_threaded():
    g = fx.Graph()
    x = g.placeholder("x")
    before = g.call_function(torch.neg, (x,))
    w = g.call_method("add_", (x, 1.0))
    s = g.call_function(operator.setitem, (x, 0, 5.0))
    after = g.call_function(torch.neg, (x,))
    g.output((before, w, s, after))
    assert writes_first_arg(w, nn.Module()) and writes_first_arg(s, nn.Module())
    assert not writes_first_arg(before, nn.Module())
    # setitem's and the later neg's input move to add_, then the later neg's and the output's
    # (which returns add_'s result after setitem) to setitem
    assert thread_in_place(g, nn.Module()) == 4
    assert before.args == (x,) and s.args[0] is w and after.args == (s,)
    assert s.target is setitem_
    out = fx.GraphModule(nn.Module(), g)(torch.zeros(3))
    assert out[0].tolist() == [0, 0, 0] and out[1].tolist() == [5, 1, 1] and out[2] is out[1]


def test_an_in_place_module_counts_as_a_write():
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)))
    relu = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "1")
    assert writes_first_arg(relu, gm)
    assert not writes_first_arg(next(n for n in gm.graph.nodes if n.target == "0"), gm)


def plus_one_(x):
    """A user's function named like an in-place op that is not one."""
    return x + 1


def test_a_users_function_named_like_an_in_place_op_is_not_threaded():
    g = fx.Graph()
    x = g.placeholder("x")
    f = g.call_function(plus_one_, (x,))
    after = g.call_function(torch.neg, (x,))
    g.output((f, after))
    assert thread_in_place(g, nn.Module()) == 0 and after.args == (x,)
    out = fx.GraphModule(nn.Module(), g)(torch.zeros(2))
    assert out[1].tolist() == [0, 0]
