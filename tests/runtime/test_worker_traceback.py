"""``outcore --debug`` shows the failing worker's own traceback: the launcher's error carries it
as its cause (a one-line error without ``--debug``)."""

from __future__ import annotations

import pytest

from outcore.errors import RuntimeFailure
from outcore.runtime.launch import WorkerTraceback, run_local

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def _deep_inside_the_model():
    raise ValueError("shapes do not fit")


def failing_worker(ctx):
    try:
        _deep_inside_the_model()
    except ValueError as e:  # as the training worker does: an OutcoreError naming rank and step
        raise RuntimeFailure(f"rank {ctx.rank} step 0: ValueError: {e}") from e


def test_worker_traceback_is_the_cause_of_the_launch_error():
    with pytest.raises(RuntimeFailure) as info:
        run_local(failing_worker, 1, timeout_s=30)
    assert str(info.value).count("\n") == 0, "the error itself stays one line"
    cause = info.value.__cause__
    assert isinstance(cause, WorkerTraceback)
    assert "_deep_inside_the_model" in str(cause) and "Traceback" in str(cause)
