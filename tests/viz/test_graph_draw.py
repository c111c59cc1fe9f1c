"""draw_graph writes valid pictures, adapts its size, colours by device and condenses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.graph.ir import build
from outcore.viz import draw_graph
from outcore.viz.graph_draw import node_label, shorten
from tests.viz.files import png_size, svg_text
from tests.viz.graphs import blocks, diamond, synthetic


def test_png_is_written(tmp_path):
    out = draw_graph(diamond(), tmp_path / "d.png", dpi=60)
    assert out == tmp_path / "d.png"
    png_size(out)


def test_svg_parses_and_keeps_labels(tmp_path):
    text = svg_text(draw_graph(diamond(), tmp_path / "sub" / "d.svg", title="my diamond"))
    for word in ("my diamond", "b1", "add", "linear", "7 nodes"):
        assert word in text


@pytest.mark.parametrize("name", ["d.pdf", "d", "d.PNG.txt"])
def test_bad_suffix_names_the_allowed_ones(tmp_path, name):
    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        draw_graph(diamond(), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_upper_case_suffix_is_fine(tmp_path):
    png_size(draw_graph(diamond(), tmp_path / "d.PNG", dpi=60))


def test_assignment_legend_and_cut(tmp_path):
    g = diamond()
    devices = np.array([0, 0, 0, 1, 1, 1, 1])
    text = svg_text(draw_graph(g, tmp_path / "d.svg", assignment=devices))
    assert "device 0: 3 nodes" in text and "device 1: 4 nodes" in text
    assert "% compute" in text and "edges cross devices" in text
    plan = SimpleNamespace(assignment=devices)  # anything with .assignment, like a Plan
    assert "device 1: 4 nodes" in svg_text(draw_graph(g, tmp_path / "p.svg", assignment=plan))


@pytest.mark.parametrize("bad", [np.zeros(3, dtype=int), np.full(7, -1), np.full(7, 0.5)])
def test_bad_assignment_is_a_usage_error(tmp_path, bad):
    with pytest.raises(UsageError, match="assignment"):
        draw_graph(diamond(), tmp_path / "d.png", assignment=bad)


def test_collapse_kicks_in_above_max_nodes(tmp_path):
    g = blocks(6, 8)
    text = svg_text(draw_graph(g, tmp_path / "b.svg", max_nodes=20))
    assert "collapsed to module depth 2" in text and "block3" in text
    assert "layer5" not in text  # the layers are inside the blocks now
    assert "collapsed" not in svg_text(draw_graph(g, tmp_path / "full.svg", max_nodes=400))


def test_huge_graph_without_modules_is_banded(tmp_path):
    g = synthetic(10_000, 30)
    devices = (np.arange(g.num_nodes) * 2) // g.num_nodes
    text = svg_text(draw_graph(g, tmp_path / "s.svg", assignment=devices))
    assert "bands of topological levels" in text and "levels 0-" in text


def test_figure_grows_with_the_graph(tmp_path):
    def fan(k):  # one input feeding k parallel nodes joined by one output
        src = [0] * k + list(range(1, k + 1))
        dst = list(range(1, k + 1)) + [k + 1] * k
        names = ["in"] + [f"branch_number_{i}" for i in range(k)] + ["out"]
        return build(f"fan{k}", fwd_s=np.ones(k + 2), src=src, dst=dst, names=names)

    w2, h2 = png_size(draw_graph(fan(2), tmp_path / "f2.png", dpi=50))
    w12, h12 = png_size(draw_graph(fan(12), tmp_path / "f12.png", dpi=50))
    assert w12 > 2 * w2 and h12 >= h2


def test_labels():
    assert node_label("layer1_0_conv1", "layer1.0.conv1") == "layer1.0.conv1"
    assert node_label("layer1_0_relu_1", "layer1.0.relu") == "layer1.0.relu#2"
    assert node_label("add_3", "layer1.0") == "layer1.0/add_3"
    assert node_label("layer1.0", "layer1.0") == "layer1.0"
    assert node_label("x", "") == "x"
    short = shorten("blocks.11.attention.heads.3.query_projection", 20)
    assert len(short) <= 20 and short.startswith("…") and short.endswith("query_projection")


def test_same_graph_same_bytes(tmp_path):
    a = draw_graph(blocks(3, 4), tmp_path / "a.svg").read_bytes()
    b = draw_graph(blocks(3, 4), tmp_path / "b.svg").read_bytes()
    assert a == b


def test_drawing_needs_neither_torch_nor_pyplot(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from outcore.viz import draw_graph; from tests.viz.graphs import diamond;"
            f"draw_graph(diamond(), {str(tmp_path / 'd.svg')!r});"
            "assert 'torch' not in sys.modules, 'torch imported';"
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
