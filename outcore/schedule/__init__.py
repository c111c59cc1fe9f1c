"""The schedule IR (per-rank action lists), its builders, its checks, the one lowering of a plan
to a schedule, and the schedule's JSON form (no torch)."""

from outcore.schedule.build import KINDS, build, inflight_limits, simple_link, with_messages
from outcore.schedule.check import check
from outcore.schedule.costs import PieceCosts, mb_scale, piece_costs
from outcore.schedule.ir import Action, Schedule
from outcore.schedule.lower import Lowered, lower

__all__ = ["KINDS", "Action", "Lowered", "PieceCosts", "Schedule", "build", "check",
           "inflight_limits", "lower", "mb_scale", "piece_costs", "simple_link",
           "with_messages"]
