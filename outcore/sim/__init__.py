"""Discrete-event simulation of schedules on clusters (no torch)."""

from outcore.hardware.collectives import ring_allreduce_s
from outcore.sim.engine import simulate_schedule
from outcore.sim.model import SimOptions
from outcore.sim.simulate import SimResult, simulate
from outcore.trace import Event, Timeline, save_chrome_trace, to_chrome_trace

__all__ = ["Event", "SimOptions", "SimResult", "Timeline", "ring_allreduce_s",
           "save_chrome_trace", "simulate", "simulate_schedule", "to_chrome_trace"]
