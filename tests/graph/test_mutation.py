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


class TableThroughViews(nn.Module):
    """Pegasus-X's positional table: a zero tensor written through two slices, then read."""

    def forward(self, x):  # x: [b, s, d]
        s, d = x.shape[1], x.shape[2]
        pos = torch.arange(s, dtype=x.dtype)[:, None]
        pe = torch.zeros(s, d, dtype=x.dtype)
        pe[:, : d // 2] = torch.sin(pos)
        pe[:, d // 2:] = torch.cos(pos * 2)
        return x + pe[None]


def _ancestors(n: fx.Node) -> set[fx.Node]:
    seen, todo = set(), [n]
    while todo:
        for u in todo.pop().all_input_nodes:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def test_a_write_through_a_view_orders_the_bases_later_readers():
    """Exported, the table's reader depended on the zeros alone (a partition ran it before
    the writes, and a 2-device pipeline of hf:pegasus_x trained on a table of zeros): it now
    reads the base as written, after both writes, and the values are unchanged."""
    from outcore.graph.capture.export import export_trace

    net, x = TableThroughViews(), torch.randn(2, 4, 6)
    gm, _ = export_trace(net, (x,))
    writes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(writes) == 2
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert set(writes) <= _ancestors(add)
    torch.testing.assert_close(gm(x), net(x), rtol=0, atol=0)
    y = torch.randn(3, 4, 6)
    torch.testing.assert_close(gm(y), net(y), rtol=0, atol=0)


def test_the_written_base_holds_the_write_on_a_copy_of_the_base():
    """Cut into pieces, the base a piece receives is a copy without the write: the written
    base is that copy with the view's part set, and gradients reach both."""
    from outcore.graph.capture.mutation import written_base

    base = torch.zeros(3, 4, requires_grad=True)
    value = torch.ones(3, 2, requires_grad=True)
    chain = (("aten.slice.Tensor", (1, 2, 4), {}),)
    out = written_base(base * 1, value, chain)
    assert out[:, 2:].eq(1).all() and out[:, :2].eq(0).all() and base.eq(0).all()
    (out * torch.arange(12.0).view(3, 4)).sum().backward()
    assert base.grad[:, 2:].eq(0).all() and base.grad[:, :2].ne(0).any()
    torch.testing.assert_close(value.grad, torch.arange(12.0).view(3, 4)[:, 2:])
