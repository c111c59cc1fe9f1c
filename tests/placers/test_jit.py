"""The compiled kernels give the same plans as the plain-Python ones (skipped without numba)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
import numpy as np
from outcore.graph.generators import make
from outcore.placers import partition
from outcore.placers._jit import HAVE_NUMBA
out = {"jit": HAVE_NUMBA}
for fam in ("rnn", "transformer"):
    g = make(fam, 150, 3)
    for strategy, mem in (("pardnn", None), ("pardnn", 0.5), ("pipeline", 0.5), ("heft", None)):
        limit = None if mem is None else float(g.param_bytes.sum() * 4 + g.saved_bytes.sum()) * mem
        try:
            r = partition(g, 3, strategy=strategy, memory_bytes=limit)
            out[fam + strategy + str(mem)] = [r.assignment.tolist(), r.makespan_s]
        except Exception as e:
            out[fam + strategy + str(mem)] = type(e).__name__
print(json.dumps(out))
"""


def _run(jit: bool) -> dict:
    env = dict(os.environ)
    env.pop("OUTCORE_NO_JIT", None)
    env["OUTCORE_JIT"] = "always" if jit else "never"
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
def test_compiled_and_plain_kernels_agree():
    compiled, plain = _run(True), _run(False)
    assert compiled.pop("jit") is True and plain.pop("jit") is False
    assert compiled == plain
