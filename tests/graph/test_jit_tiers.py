"""Kernels run as Python until compiling pays (outcore.graph.jit under ``OUTCORE_JIT=auto``):
a small plan on an empty numba cache compiles nothing and gives what plain Python gives; the
kernels it ran are compiled in the background for the next process, which loads them; a large
array or a spent time budget compiles at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outcore.graph import jit_warm

pytest.importorskip("numba")

PLAN = """
import json, sys
import numpy as np
import outcore
from outcore.graph import jit
from outcore.graph.generators import make
g = make("transformer", 120, 3)
p = outcore.plan(g, outcore.PlanRequest.make(3, None, microbatches=2))
compiled = sorted({jit.kernel_name(v) for m in list(sys.modules.values())
                   if getattr(m, "__name__", "").startswith("outcore")
                   for v in vars(m).values()
                   if hasattr(v, "overloads") and hasattr(v, "py_func") and v.overloads})
print(json.dumps({"assignment": np.asarray(p.assignment).tolist(),
                  "iteration_s": p.predicted["iteration_s"],
                  "python": jit.python_runs(), "compiled": compiled}))
"""

LEVELS = """
import json
import numpy as np
import outcore.graph.algorithms as alg
import outcore.graph.level_kernel as lk
from outcore.graph import jit
from outcore.graph.generators import make
g = make("transformer", 120, 3)
top = alg.longest_from_sources(g, np.linspace(0.1, 1.0, g.num_nodes), np.ones(g.num_edges))
print(json.dumps({"top": top.tolist(), "python": jit.python_runs(),
                  "compiled": bool(getattr(lk.top_levels, "overloads", None))}))
"""


def _run(script: str, tmp_path: Path, **env: str) -> dict:
    full = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), TMPDIR=str(tmp_path),
                OUTCORE_JIT_WARM="0")
    full.update(env)
    full.pop("OUTCORE_NO_JIT", None)
    out = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_small_plan_on_an_empty_cache_compiles_nothing_and_plans_as_python(tmp_path):
    auto = _run(PLAN, tmp_path, OUTCORE_JIT="auto")
    plain = _run(PLAN, tmp_path, OUTCORE_JIT="never")
    assert auto["compiled"] == []
    assert sum(auto["python"].values()) > 0 and plain["python"] == {}
    assert (auto["assignment"], auto["iteration_s"]) == \
        (plain["assignment"], plain["iteration_s"])


def test_kernels_that_ran_as_python_are_compiled_for_the_next_process(tmp_path):
    cache = tmp_path / "numba"
    first = _run(LEVELS, tmp_path, OUTCORE_JIT="auto", OUTCORE_JIT_WARM="1")
    assert not first["compiled"] and first["python"]["outcore.graph.level_kernel.top_levels"]
    deadline = time.monotonic() + 180
    while True:  # the warm-up started as the first process ended: wait for it to end
        running = jit_warm.running(str(cache))
        if not running and list(cache.rglob("level_kernel.top_levels-*.nbi")):
            break
        if time.monotonic() > deadline:
            for proc in running:
                proc.kill()
            pytest.fail("the background compile did not finish in 180 s")
        time.sleep(0.2)
    second = _run(LEVELS, tmp_path, OUTCORE_JIT="auto")
    assert second["compiled"] and second["python"] == {}
    assert second["top"] == first["top"]


@pytest.mark.parametrize("env", [{"OUTCORE_JIT_BIG": "50"}, {"OUTCORE_JIT_BUDGET_S": "0"}],
                         ids=["large array", "budget spent"])
def test_a_large_array_or_a_spent_budget_compiles_at_once(tmp_path, env):
    out = _run(LEVELS, tmp_path, OUTCORE_JIT="auto", **env)
    assert out["compiled"] and "outcore.graph.level_kernel.top_levels" not in out["python"]
    assert out["top"] == _run(LEVELS, tmp_path, OUTCORE_JIT="never")["top"]
