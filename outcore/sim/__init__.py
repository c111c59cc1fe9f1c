"""Discrete-event simulation of schedules on clusters (no torch)."""

from outcore.sim.engine import SimOptions, ring_allreduce_s, simulate_schedule
from outcore.sim.simulate import SimResult, cluster_from_plan, simulate
from outcore.sim.timeline import Event, Timeline, save_chrome_trace, to_chrome_trace

__all__ = ["Event", "SimOptions", "SimResult", "Timeline", "cluster_from_plan",
           "ring_allreduce_s", "save_chrome_trace", "simulate", "simulate_schedule",
           "to_chrome_trace"]
