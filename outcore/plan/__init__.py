"""The Plan value (typed: layout, memory policies, cluster), its JSON form, the planning
request, and the cut of a placed graph into pieces (no torch)."""

from outcore.plan.layout import MODES, PLAIN, Layout
from outcore.plan.pieces import Piece, Pieces, Transfer, cut
from outcore.plan.plan import FORMAT, Plan, align, fingerprint, load, make_plan, save
from outcore.plan.policies import MemoryPolicies

__all__ = ["FORMAT", "Layout", "MODES", "MemoryPolicies", "PLAIN", "Piece", "Pieces", "Plan",
           "Transfer", "align", "cut", "fingerprint", "load", "make_plan", "save"]
