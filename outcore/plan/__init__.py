"""The Plan value, its JSON form, and the cut of a placed graph into pieces (no torch)."""

from outcore.plan.pieces import Piece, Pieces, Transfer, cut
from outcore.plan.plan import FORMAT, Plan, align, fingerprint, load, make_plan, save

__all__ = ["FORMAT", "Piece", "Pieces", "Plan", "Transfer", "align", "cut", "fingerprint", "load",
           "make_plan", "save"]
