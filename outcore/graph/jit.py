"""Optional numba compilation of the inner loops of planning and lowering.

The inner loops (list-scheduling emulation, longest paths, cluster walks, greedy moves) are
written in the subset of Python that numba compiles. With numba installed they are compiled
on first use and cached on disk (``__pycache__``), which makes a 1M-node plan take seconds;
without it they run as ordinary Python on numpy arrays (correct, about 100x slower: fine for
tests and graphs of a few thousand nodes). Set ``OUTCORE_NO_JIT=1`` to force plain Python.

Why numba: the emulator is an event simulation (a priority queue per device and one for
events) that numpy cannot vectorise, and ParDNN calls it a few dozen times per plan; in plain
Python one emulation of a 1M-node graph takes ~10 s, compiled it takes ~0.2 s.
"""

from __future__ import annotations

import os

HAVE_NUMBA = False
if os.environ.get("OUTCORE_NO_JIT", "") in ("", "0"):
    try:  # pragma: no cover - depends on the environment
        import numba as _numba

        HAVE_NUMBA = True
    except ImportError:  # pragma: no cover
        HAVE_NUMBA = False


def _knows_nrt_option() -> bool:
    from numba.core.options import DefaultOptions

    return hasattr(DefaultOptions, "_nrt")


def njit_borrowing(fn):
    """:func:`njit` for kernels that allocate nothing (their arrays all come from the caller):
    compiled without numba's reference counting (NRT), which otherwise increments and
    decrements, atomically, the count of every array a call passes or a tuple hands out. In
    the simulator's event loop, whose helpers take the state as tuples of arrays, that counting
    is 85 % of the time (44k actions: 88 ms with it, 11 ms without). A kernel that allocates
    does not compile this way (numba says so on first use)."""
    if HAVE_NUMBA and _knows_nrt_option():
        return _numba.njit(cache=True, nogil=True, _nrt=False)(fn)
    return njit(fn)


def njit(fn):
    """Compile ``fn`` with ``numba.njit(cache=True)`` when numba is available, else return it.

    The plain function stays reachable as ``fn.py_func`` in both cases (tests compare them).
    """
    if HAVE_NUMBA:
        compiled = _numba.njit(cache=True, nogil=True)(fn)
        return compiled
    fn.py_func = fn
    return fn
