"""``outcore --debug`` shows the failing worker's own traceback: the launcher's error carries it
as its cause (a one-line error without ``--debug``)."""

from __future__ import annotations

import pytest

from outcore.errors import RuntimeFailure
from outcore.runtime.failures import WorkerTraceback
from outcore.runtime.launch import run_local

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


def test_only_a_failure_to_connect_while_joining_starts_the_workers_again():
    """A launch is started again when its workers failed joining the process group over a
    connection (gloo's full-mesh connect between local processes fails now and then), never
    once a worker ran the function, returned, died silently or failed for another reason."""
    from outcore.runtime.failures import JOINING, RUNNING, join_failed, silent_death
    closed = "RuntimeError: Gloo connectFullMesh failed with ... Connection closed by peer\nTb"
    assert join_failed({}, [(0, (closed, "RuntimeError", JOINING))]) == (
        "rank 0 could not join the process group: RuntimeError: Gloo connectFullMesh failed "
        "with ... Connection closed by peer")
    assert join_failed({}, [(1, (closed, "RuntimeError", RUNNING))]) is None
    assert join_failed({0: 1}, [(1, (closed, "RuntimeError", JOINING))]) is None
    assert join_failed({}, [(0, (closed, "RuntimeError", JOINING)),
                             (1, silent_death(1, -9))]) is None
    assert join_failed({}, [(0, ("ValueError: bad threads", "ValueError", JOINING))]) is None


def test_a_launch_that_could_not_join_is_started_once_more(monkeypatch, caplog):
    from outcore.runtime import launch
    tries = []

    def attempt(*args, retry):
        tries.append(retry)
        if len(tries) == 1:
            raise launch._JoinFailed("rank 1 could not join the process group: reset by peer")
        return ["a", "b"]
    monkeypatch.setattr(launch, "_attempt", attempt)
    with caplog.at_level("WARNING", logger="outcore.runtime.launch"):
        assert launch._run_workers(None, None, 2, (), 10, 1, 1, None, None) == ["a", "b"]
    assert tries == [True, False]  # the last attempt raises the run's own error
    assert "rank 1 could not join the process group: reset by peer; starting the 2 workers " \
           "again" in caplog.text


def test_a_worker_that_fails_before_joining_reports_it():
    """A failure before the process group exists (here a thread count torch refuses) is the
    launch's error at once: not a connection, so not tried again."""
    with pytest.raises(RuntimeFailure, match="rank 0 failed: RuntimeError"):
        run_local(failing_worker, 1, timeout_s=30, threads=-1)
