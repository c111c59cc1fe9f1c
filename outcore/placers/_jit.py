"""The planners' optional numba compilation: :mod:`outcore.graph.jit` (kept here for the
kernels that import it from the partition package)."""

from outcore.graph.jit import HAVE_NUMBA, njit, njit_borrowing

__all__ = ["HAVE_NUMBA", "njit", "njit_borrowing"]
