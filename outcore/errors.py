"""The outcore error tree.

Every error a user can cause is an :class:`OutcoreError`; catch it at the level you care about.
Messages say what failed, why, and the fix. The CLI prints them as one line and exits with code 2.

Messages name options as the command line spells them (``--batch-size``); a caller of the
Python API gets them in its own spelling (``batch_size``) from :func:`in_api_spelling`, which
the public functions apply to every error that leaves them unless the command line called them
(:func:`cli_spelling`).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar


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
    """No placement fits the memory limit; the message names the smallest fix.

    ``min_devices`` / ``min_memory_bytes``: what would fit (a suggestion, which a refusal
    checks); ``need_bytes``: what the placement tried needed on its fullest device."""

    def __init__(self, message: str, *, min_devices: int | None = None,
                 min_memory_bytes: float | None = None, need_bytes: float | None = None):
        super().__init__(message)
        self.min_devices = min_devices
        self.min_memory_bytes = min_memory_bytes
        self.need_bytes = need_bytes


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


_CLI: ContextVar[bool] = ContextVar("outcore_cli_spelling", default=False)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (\d[\w.]*|auto|none|given)"
                   r"(?![\w.]))?")


def in_api_spelling(message: str) -> str:
    """``message`` with command-line options written as the Python API's keyword arguments:
    ``--devices 4`` -> ``devices=4``, ``raise --memory`` -> ``raise `memory```."""
    def spelled(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return f"{name}={m.group(2)}" if m.group(2) else f"`{name}`"
    return _FLAG.sub(spelled, message)


@contextlib.contextmanager
def cli_spelling() -> Iterator[None]:
    """Within the block, errors keep the command line's spelling (the CLI's own calls)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


F = TypeVar("F", bound=Callable[..., Any])


def speaks_api(fn: F) -> F:
    """Decorate a public function: an :class:`OutcoreError` leaving it names the API's
    arguments, not command-line flags (unless the command line called it)."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OutcoreError as e:
            if not _CLI.get() and e.args and isinstance(e.args[0], str):
                e.args = (in_api_spelling(e.args[0]),) + e.args[1:]
            raise
    return call  # type: ignore[return-value]
