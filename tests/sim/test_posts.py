"""Where the simulator allocates a receive's buffer (``sim.model.post_positions``): as the
runtime posts it, ``RECV_POST_AHEAD`` actions before the receive, or earlier with a message
its peer sent after it (a peer's messages are posted in the order they are sent)."""

from __future__ import annotations

import numpy as np

from outcore.graph import build as gbuild
from outcore.plan import cut
from outcore.schedule import Action, Schedule, build, piece_costs, simple_link
from outcore.schedule.ir import RECV_POST_AHEAD
from outcore.sim.model import post_positions


def _two_ranks(sender: list[str], receiver: list[str]) -> Schedule:
    g = gbuild("c", fwd_s=[1, 1], src=[0], dst=[1])
    P = cut(g, np.array([0, 1]))
    s = build(P, 2, 2, "1f1b", piece_costs(g, P, 2), simple_link(1e9, 0))
    acts = (tuple(Action.parse(a) for a in sender), tuple(Action.parse(a) for a in receiver))
    return Schedule(s.kind, 2, 2, s.pieces, acts, s.buckets)


def test_a_message_sent_first_is_posted_with_a_later_ones_post():
    # rank 0 sends micro-batch 0, then 1; rank 1 takes 1 first (place 5), then 0 (place 10)
    s = _two_ranks(["0F0", "t0SF0", "0F1", "t0SF1"],
                   ["1F0"] * 5 + ["t0RF1"] + ["1F0"] * 4 + ["t0RF0"])
    post = post_positions(s)[1]
    assert post[5] == 5 - RECV_POST_AHEAD
    assert post[10] == 5 - RECV_POST_AHEAD  # posted to post micro-batch 1's, which follows it
    assert list(post[:5]) == [0, 1, 2, 3, 4]  # other actions: their own place


def test_in_order_receives_are_posted_ahead_and_a_packed_pair_together():
    s = _two_ranks(["0F0", "t0SF0", "0F1", "t0SF1"],
                   ["1F0"] * 5 + ["t0RF0"] + ["1F0"] * 4 + ["t0RF1"])
    post = post_positions(s)[1]
    assert post[5] == 5 - RECV_POST_AHEAD and post[10] == 10 - RECV_POST_AHEAD
    # consecutive sends taken by consecutive receives travel as one message
    s = _two_ranks(["0F0", "0F1", "t0SF0", "t0SF1"], ["1F0"] * 6 + ["t0RF0", "t0RF1"])
    post = post_positions(s)[1]
    assert post[6] == post[7] == 6 - RECV_POST_AHEAD
