"""Planner tests run the kernels as plain Python (no numba compile: tiny graphs, fast start).

``test_jit.py`` checks that the compiled kernels give the same results. Set
``OUTCORE_TEST_JIT=1`` to run everything compiled instead.
"""

from __future__ import annotations

import os

if os.environ.get("OUTCORE_TEST_JIT", "") in ("", "0"):
    os.environ.setdefault("OUTCORE_NO_JIT", "1")
