"""draw_timeline and draw_comparison on hand-made timelines."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import UsageError
from outcore.trace import Event, Timeline
from outcore.viz import draw_comparison, draw_timeline
from outcore.viz.gantt import category, stack_lanes
from tests.viz.fake import one_f_one_b
from tests.viz.files import png_size, svg_text


def test_timeline_png(tmp_path):
    png_size(draw_timeline(one_f_one_b(4, 6), tmp_path / "t.png", dpi=50))


def test_timeline_svg_has_lanes_units_and_limit(tmp_path):
    text = svg_text(draw_timeline(one_f_one_b(2, 4), tmp_path / "t.svg"))
    for word in ("rank 0", "rank 1", "comm", "time (ms)", "memory (GiB)", "limit 3.00 GiB",
                 "forward", "backward", "send activations", "send gradients", "all-reduce",
                 "idle", "busy", "1f1b"):
        assert word in text, word


def test_micro_batch_numbers_only_when_they_fit(tmp_path):
    tl = one_f_one_b(2, 3)
    text = svg_text(draw_timeline(tl, tmp_path / "t.svg"))
    assert " 2 " in f" {text} "
    tiny = Timeline(1, (Event(0, "F", "0F7", 0.0, 1e-6, mb=7),
                        Event(0, "B", "0B7", 1e-6, 1.0, mb=8)), 1.0)
    text = svg_text(draw_timeline(tiny, tmp_path / "tiny.svg"))
    assert " 8 " in f" {text} " and " 7 " not in f" {text} "


def test_timeline_without_memory_or_events(tmp_path):
    tl = Timeline(2, (Event(0, "F", "0F0", 0.0, 0.5, mb=0),), 1.0)
    assert "memory" not in svg_text(draw_timeline(tl, tmp_path / "a.svg", title="nothing else"))
    svg_text(draw_timeline(Timeline(1, (), 0.0), tmp_path / "empty.svg"))


def test_comparison(tmp_path):
    pred = one_f_one_b(3, 4)
    meas = one_f_one_b(3, 4, jitter=0.2, source="measured", seed=2)
    png_size(draw_comparison(pred, meas, tmp_path / "c.png", dpi=40))
    text = svg_text(draw_comparison(pred, meas, tmp_path / "c.svg"))
    assert "predicted:" in text and "measured:" in text and "%)" in text


def test_many_ranks_are_sampled(tmp_path):
    tl = one_f_one_b(12, 2)
    text = svg_text(draw_timeline(tl, tmp_path / "m.svg", max_ranks=4))
    assert "4 of 12 ranks shown" in text and "rank 11" in text and "rank 5" not in text


def test_bad_suffix(tmp_path):
    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        draw_timeline(one_f_one_b(2, 2), tmp_path / "t.jpg")
    with pytest.raises(UsageError):
        draw_comparison(one_f_one_b(2, 2), one_f_one_b(2, 2), tmp_path / "t.gif")


def test_categories():
    assert category(Event(0, "send", "t3SF1", 0, 1, "comm")) == "send_act"
    assert category(Event(0, "send", "t3SB1", 0, 1, "comm")) == "send_grad"
    assert category(Event(0, "recv", "t3RB1", 0, 1, "comm")) == "recv_grad"
    assert category(Event(0, "allreduce", "DP2", 0, 1, "comm")) == "allreduce"
    assert category(Event(0, "F", "0F1", 0, 1)) == "F"
    assert category(Event(0, "mystery", "?", 0, 1)) == "other"


def test_overlapping_events_get_separate_sub_lanes():
    evs = [Event(0, "send", "a", 0.0, 2.0, "comm"), Event(0, "send", "b", 1.0, 3.0, "comm"),
           Event(0, "send", "c", 2.0, 4.0, "comm"), Event(0, "send", "d", 3.5, 5.0, "comm")]
    lanes, count = stack_lanes(evs)
    assert count == 2 and lanes == [0, 1, 0, 1]
    assert stack_lanes([])[1] == 1


def test_memory_lines_reach_the_end(tmp_path):
    mem = ((np.array([0.0, 0.2]), np.array([1e6, 3e6])),)
    tl = Timeline(1, (Event(0, "F", "0F0", 0.0, 0.4, mb=0),), 0.5, mem, None)
    text = svg_text(draw_timeline(tl, tmp_path / "m.svg"))
    assert "memory (MiB)" in text and "peak 2.86 MiB" in text and "limit" not in text
