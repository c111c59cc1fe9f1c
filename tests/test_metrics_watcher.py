"""The progress of ``outcore train`` tails rank 0's metrics file: only this run's steps are
shown, whatever an earlier run in the same folder left, and nothing in the file stops a run."""

from __future__ import annotations

import json
import time

from outcore.report import MetricsWatcher
from outcore.runtime.resume import open_metrics


def _line(step: int, stamp: float) -> str:
    return json.dumps({"step": step, "time": stamp, "loss": 1.0}) + "\n"


def test_only_this_runs_steps_reach_the_callback(tmp_path):
    path = tmp_path / "metrics.jsonl"
    before = time.time() - 60
    path.write_text("".join(_line(s, before) for s in range(10)))  # an earlier run's file
    seen: list[int] = []
    watcher = MetricsWatcher(path, lambda r: seen.append(r["step"]))
    watcher.poll()
    assert seen == []  # the earlier run's steps are not this run's progress
    f = open_metrics(str(path), 0)  # this run starts afresh: a new file
    f.write(_line(0, time.time()))
    f.write('{"step": 1, "ti')  # torn: waits for the rest of its line
    f.flush()
    watcher.poll()
    assert seen == [0]
    f.write('me": %r, "loss": 1.0}\n' % time.time())
    f.write("not json\n")  # skipped, never raised
    f.write(_line(2, time.time()))
    f.flush()
    watcher.poll()
    assert seen == [0, 1, 2]
    f.close()


def test_a_resumed_run_rewriting_the_file_is_read_from_its_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(s, time.time() - 60) for s in range(4)))
    seen: list[int] = []
    watcher = MetricsWatcher(path, lambda r: seen.append(r["step"]))
    watcher.poll()
    f = open_metrics(str(path), 2)  # resumed at step 2: steps 0 and 1 kept, the file replaced
    f.write(_line(2, time.time()))
    f.flush()
    watcher.poll()
    assert seen == [2]
    f.close()
    path.write_text(_line(0, time.time()))  # the same file, shorter: read from its start
    watcher.poll()
    assert seen == [2, 0]
