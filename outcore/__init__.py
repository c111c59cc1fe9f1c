"""outcore: train deep networks too large for one device, across many, automatically.

The public functions live in :mod:`outcore.api` (and :func:`train` in :mod:`outcore.job`) and
are re-exported here; torch is imported only by the functions that need it.
"""

from outcore.api import (
    PlanRequest,
    capture,
    check_fits,
    cluster_of,
    collapse,
    device_loads,
    draw_graph,
    draw_timeline,
    estimate,
    launcher,
    load_graph,
    load_plan,
    lower,
    make_cluster,
    model_graph,
    parallelize,
    plan,
    plan_request,
    profile,
    save_chrome_trace,
    save_graph,
    save_plan,
    save_schedule,
    simulate,
    strategies,
    with_tensor_parallel,
)
from outcore.config import options_doc as _options_doc, train_signature as _train_signature
from outcore.errors import OutcoreError, speaks_api

__version__ = "0.1.0"

__all__ = ["OutcoreError", "PlanRequest", "capture", "check_fits", "cluster_of", "collapse",
           "device_loads", "draw_graph", "draw_timeline", "estimate", "launcher", "load_graph",
           "load_plan", "lower", "make_cluster", "model_graph", "parallelize", "plan",
           "plan_request", "profile", "save_chrome_trace", "save_graph", "save_plan",
           "save_schedule", "simulate", "strategies", "tensor_parallel", "auto_parallelize",
           "train", "with_tensor_parallel"]


@speaks_api
def train(model, devices=None, *, progress=None, on_metrics=None, **options):
    from outcore.job import train as _train
    return _train(model, devices, progress=progress, on_metrics=on_metrics, **options)


train.__doc__ = """Train ``model`` on ``devices`` local workers (one per device): capture its graph,
cost every layer, plan it, train, and report measured time and memory beside the plan's
prediction (a :class:`outcore.job.TrainReport`; the files are in ``report.run_dir``).

``progress(phase, done, total)`` follows the preparation; ``on_metrics(record)`` receives each
step's metrics. A script that calls it must guard the call with ``if __name__ == "__main__":``
(local workers import the script). Every option of ``outcore train`` is a keyword argument of
the same name, ``_`` for ``-``:

""" + _options_doc("train")
train.__signature__ = _train_signature()


def tensor_parallel(*args, **kwargs):
    """Split a model's layers over a tensor-parallel group (see
    :func:`outcore.parallel.tensor.tensor_parallel`)."""
    from outcore.parallel.tensor import tensor_parallel as _tensor_parallel
    return _tensor_parallel(*args, **kwargs)


def auto_parallelize(*args, **kwargs):
    """Context manager: models built inside become tensor-parallel (see
    :func:`outcore.parallel.tensor.auto_parallelize`)."""
    from outcore.parallel.tensor import auto_parallelize as _auto_parallelize
    return _auto_parallelize(*args, **kwargs)
