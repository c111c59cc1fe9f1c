"""The schedule IR (per-rank action lists), its builders and its checks (no torch)."""

from outcore.schedule.build import KINDS, build, inflight_limits, lower, simple_link
from outcore.schedule.check import check
from outcore.schedule.costs import PieceCosts, mb_scale, piece_costs
from outcore.schedule.ir import Action, Schedule

__all__ = ["KINDS", "Action", "PieceCosts", "Schedule", "build", "check", "inflight_limits",
           "lower", "mb_scale", "piece_costs", "simple_link"]
