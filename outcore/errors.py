"""The outcore error tree.

Every error a user can cause is an :class:`OutcoreError`; catch it at the level you care about.
Messages say what failed, why, and the fix. The CLI prints them as one line and exits with code 2.
"""

from __future__ import annotations


class OutcoreError(Exception):
    """Base of every error outcore raises on purpose."""

    exit_code = 2


class UsageError(OutcoreError):
    """A bad argument: unit, shape, option combination."""


class ModelError(OutcoreError):
    """A model name that cannot be resolved, or a model that fails to build or run."""


class CaptureError(ModelError):
    """torch.fx could not capture the model, even with fallbacks."""


class GraphError(OutcoreError):
    """A graph that is malformed: cycle, missing field, negative cost, unknown node."""


class FormatError(OutcoreError):
    """A file that is not the format it claims (graph, plan, report)."""


class PlanError(OutcoreError):
    """No plan exists under the constraints, or a plan is inconsistent with its graph."""


class InfeasibleError(PlanError):
    """No placement fits the memory limit; the message names the smallest fix."""

    def __init__(self, message: str, *, min_devices: int | None = None,
                 min_memory_bytes: float | None = None):
        super().__init__(message)
        self.min_devices = min_devices
        self.min_memory_bytes = min_memory_bytes


class ScheduleError(OutcoreError):
    """A schedule that is ill-formed: unmatched send/recv, wrong order, deadlock."""


class RuntimeFailure(OutcoreError):
    """A distributed run that failed: a worker died, hung or raised."""


class LaunchError(RuntimeFailure):
    """Workers could not be started or joined."""


class Interrupted(LaunchError):
    """The main process was asked to stop (SIGINT, SIGTERM, SIGHUP); every worker was stopped.
    The exit code is the shell's convention for that signal: 128 + its number."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class CheckpointError(RuntimeFailure):
    """A checkpoint folder that cannot be used: locked by another job, writable by others,
    corrupted, or written for another model."""


class NonFiniteError(RuntimeFailure):
    """A training step produced a NaN or infinite loss or gradient."""
