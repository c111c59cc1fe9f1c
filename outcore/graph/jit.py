"""Optional numba compilation of the inner loops of planning and lowering.

The inner loops (list-scheduling emulation, longest paths, cluster walks, greedy moves, the
simulator's event loop) are written in the subset of Python that numba compiles. Compiled
they make a 1M-node plan take seconds; as ordinary Python on numpy arrays they are about 100x
slower, which is still fine for graphs of a few thousand nodes. Compiling them costs about a
minute of numba's front end the first time (then they load from the cache in ``__pycache__``
at once), so by default (``OUTCORE_JIT=auto``) a kernel is compiled only when that pays:

- its compiled form is in numba's cache, or was compiled earlier in this process;
- or it, or any kernel before it in this process, is called with a large array (over
  :data:`BIG_ELEMENTS` elements: a large graph, where every kernel pays);
- or it has already spent :data:`PYTHON_BUDGET_S` seconds running as Python in this process.

Otherwise it runs as Python, and when the process ends a background process compiles the
kernels that ran so into the cache, for the next run (``OUTCORE_JIT_WARM=0``: not). A newcomer's
first small job thus starts at once instead of after the compiler.

``OUTCORE_JIT=always`` (or :func:`compile_always`) compiles every kernel on first use;
``OUTCORE_JIT=never`` (or ``OUTCORE_NO_JIT=1``) never compiles. Without numba the kernels are
plain Python functions.

Why numba: the emulator is an event simulation (a priority queue per device and one for
events) that numpy cannot vectorise, and ParDNN calls it a few dozen times per plan; in plain
Python one emulation of a 1M-node graph takes ~10 s, compiled it takes ~0.2 s.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, Callable

BIG_ELEMENTS = int(os.environ.get("OUTCORE_JIT_BIG", "20000"))
PYTHON_BUDGET_S = float(os.environ.get("OUTCORE_JIT_BUDGET_S", "5.0"))


def _mode() -> str:
    if os.environ.get("OUTCORE_NO_JIT", "") not in ("", "0"):
        return "never"
    m = os.environ.get("OUTCORE_JIT", "auto").strip().lower()
    m = {"1": "always", "0": "never"}.get(m, m)
    return m if m in ("always", "never") else "auto"


MODE = _mode()
HAVE_NUMBA = False
if MODE != "never":
    try:  # pragma: no cover - depends on the environment
        import numba as _numba
        from numba.core.registry import CPUDispatcher as _Dispatcher

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
        return _tiered(_numba.njit(cache=True, nogil=True, _nrt=False)(fn))
    return njit(fn)


def njit(fn):
    """Compile ``fn`` with ``numba.njit(cache=True)`` when numba is available (when that pays,
    under ``OUTCORE_JIT=auto``: see the module), else return it.

    The plain function stays reachable as ``fn.py_func`` in both cases (tests compare them).
    """
    if HAVE_NUMBA:
        return _tiered(_numba.njit(cache=True, nogil=True)(fn))
    fn.py_func = fn
    return fn


# -- auto: Python until compiling pays --------------------------------------------------------

_spent_s: dict[int, float] = {}       # id(kernel) -> seconds it ran as Python here
_cold: set[int] = set()               # kernels found missing from the cache here
_wanted: dict[int, tuple[Any, tuple]] = {}  # id(kernel) -> (kernel, argument types) to warm
_python_runs: dict[str, int] = {}     # kernel name -> calls run as Python here


def _tiered(d):
    """Under ``OUTCORE_JIT=auto``, ``d`` as a :class:`_Kernel` (numba's dispatcher, whose calls
    from Python first decide whether to compile); otherwise ``d`` itself."""
    if MODE == "auto":
        d.__class__ = _Kernel  # same object and layout: only its call from Python changes
    return d


def compile_always() -> None:
    """From now on in this process, compile every kernel on its next call (as numba would)."""
    global MODE
    if MODE == "auto":
        MODE = "always"


def kernel_name(d) -> str:
    return f"{d.py_func.__module__}.{d.py_func.__qualname__}"


def python_runs() -> dict[str, int]:
    """Per kernel (``module.name``), how many calls from Python ran as Python in this process."""
    return dict(_python_runs)


def _elements(args: tuple) -> int:
    most = 0
    for a in args:
        if isinstance(a, tuple):
            most = max(most, _elements(a))
        else:
            most = max(most, int(getattr(a, "size", 0) or 0))
    return most


def _cached(d) -> bool:
    """Whether numba's cache holds a current compiled form of ``d`` (any signature). Read
    through numba's cache object; if that is not as expected, say yes (compile as numba
    would)."""
    try:
        return bool(d._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - another numba: fall back to compiling
        return True


_large = False  # this process has met a large graph: every kernel compiles from then on


def _pays(d, args: tuple) -> bool:
    global _large
    if MODE != "auto" or d.overloads or _large:
        return True
    if id(d) not in _cold:
        if _cached(d):
            return True
        _cold.add(id(d))
    if _elements(args) > BIG_ELEMENTS:
        _large = True
        return True
    return _spent_s.get(id(d), 0.0) >= PYTHON_BUDGET_S


class _PythonGlobals(dict):
    """A kernel's module namespace as its Python form sees it: a kernel not (yet) compiled in
    this process is its Python form (else one compiled kernel would compile all it calls)."""

    def __init__(self, module: dict):
        super().__init__(__builtins__=module.get("__builtins__", __builtins__))
        self.module = module

    def __missing__(self, name: str):
        value = self.module[name]
        if HAVE_NUMBA and type(value) is _Kernel:
            return _python_form(value)
        return value


_namespaces: dict[int, _PythonGlobals] = {}
_forms: dict[int, Callable] = {}


def _python_form(d) -> Callable:
    fn = _forms.get(id(d))
    if fn is None:
        src = d.py_func
        ns = _namespaces.get(id(src.__globals__))
        if ns is None:
            ns = _namespaces[id(src.__globals__)] = _PythonGlobals(src.__globals__)
        fn = types.FunctionType(src.__code__, ns, src.__name__, src.__defaults__,
                                src.__closure__)
        fn.__qualname__, fn.__kwdefaults__ = src.__qualname__, src.__kwdefaults__
        _forms[id(d)] = fn
    return fn


if HAVE_NUMBA:
    class _Kernel(_Dispatcher):
        """A numba dispatcher that runs its kernel as Python until compiling pays."""

        def __call__(self, *args, **kwargs):
            if _pays(self, args):
                self.__class__ = _Dispatcher  # decided for this process: numba's own call now
                return self(*args, **kwargs)
            if id(self) not in _wanted and not kwargs:
                _want(self, args)
            start = time.perf_counter()
            try:
                return _python_form(self)(*args, **kwargs)
            finally:
                _spent_s[id(self)] = _spent_s.get(id(self), 0.0) + time.perf_counter() - start
                name = kernel_name(self)
                _python_runs[name] = _python_runs.get(name, 0) + 1


def _want(d, args: tuple) -> None:
    """Remember ``d``'s argument types, for the background compile at exit."""
    try:
        sig = tuple(d.typeof_pyval(a) for a in args)
    except Exception:  # noqa: BLE001 - a type numba cannot name: nothing to warm
        return
    if not _wanted and _warms():
        atexit.register(_warm_in_background)
    _wanted[id(d)] = (d, sig)


def _warms() -> bool:
    import multiprocessing

    return os.environ.get("OUTCORE_JIT_WARM", "1") not in ("0", "") and \
        multiprocessing.parent_process() is None


def _warm_in_background() -> None:
    """Start a detached, low-priority process that compiles into numba's cache the kernels
    that ran as Python here (one such process at a time: it holds a lock)."""
    wanted = [(d.py_func.__module__, d.py_func.__qualname__, sig)
              for d, sig in _wanted.values() if not d.overloads]
    if not wanted:
        return
    try:
        fd, path = tempfile.mkstemp(prefix="outcore-jit-warm-", suffix=".pkl")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(wanted, f)
        subprocess.Popen([sys.executable, "-m", "outcore.graph.jit_warm", path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         env=dict(os.environ, OUTCORE_JIT="always"))
    except OSError:  # no room for the list, or no process: the next run compiles as needed
        return
