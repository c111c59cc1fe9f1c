"""Per-layer time regression fitted on measured layers (numpy least squares; no scikit-learn).

The seed project (OSU "Scaling Distributed DNN Training for Large Images", analytical-model
slides) fitted conv time with a polynomial in channels, kernel and image size
(``sklearn.PolynomialFeatures``). Here each *family* of layers has a few variables:

* ``conv2d``: batch, in-channels per group, out-channels, kernel area, output area, stride area,
  groups (``conv2d_grouped``, the same variables, for ``groups > 1``);
* ``linear``: rows (all leading dimensions), in-features, out-features;
* ``matmul`` (also ``bmm``/``mm``): batch, m, k, n;
* ``maxpool2d``, ``avgpool2d``: batch × channels, input area, output area, kernel area;
* any other op with enough samples: its forward bytes (a per-op bandwidth curve).

and :func:`fit` picks, per family and direction (forward, backward), the *form* whose k-fold
cross-validated error is lowest (score = mean of the median and 90th-percentile absolute
relative error). Forms:

* ``raw<d>``: the seed's polynomial of degree d in the raw variables, least squares on seconds;
* ``log<d>``: polynomial of degree d in the log variables, least squares on log seconds (a
  power law for d = 1; minimises relative error, which is what matters for partitioning);
* in both, terms of degree ≥ 2 use variables clipped to the training range, so outside it the
  fit continues along its linear terms instead of a diverging polynomial;
* ``work``: ``t = c0 + c1 × flops + c2 × bytes`` (a calibrated additive roofline), non-negative
  coefficients, least squares on relative error.

A family with fewer than ``MIN_SAMPLES`` samples (or fewer than any candidate form has terms)
is not cross-validated: it gets the ``work`` form from 3 samples on, and below that one
calibrated rate (seconds per FLOP, or per byte for ops without FLOPs: the geometric mean of
time / work over its samples).

A :class:`CostModel` predicts ``(fwd_s, bwd_s)`` for the families it was fitted on and returns
None for others (callers use the roofline, :mod:`outcore.cost.analytical`). It round-trips
through JSON (format ``outcore-costmodel/1``).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from outcore.cost.analytical import ZERO_COST_OPS, first_shape, itemsize, kernel_elems, work
from outcore.errors import FormatError, UsageError
from outcore.graph.ir import Graph

log = logging.getLogger(__name__)

FORMAT = "outcore-costmodel/1"
DEFAULT_FORMS = ("raw2", "raw3", "log1", "log2", "log3", "work", "wlog1", "wlog2")
_FORM = re.compile(r"^(raw|log|wlog)[1-9]$")
MIN_SAMPLES = 8
_FAMILY_OF = {"conv2d": "conv2d", "linear": "linear", "matmul": "matmul", "bmm": "matmul",
              "mm": "matmul"}
POOL_FAMILIES = ("maxpool2d", "avgpool2d")
FAMILY_VARIABLES = {
    "conv2d": ("batch", "cin_per_group", "cout", "kernel_area", "out_area", "stride_area",
               "groups"),
    "conv2d_grouped": ("batch", "cin_per_group", "cout", "kernel_area", "out_area",
                       "stride_area", "groups"),
    "maxpool2d": ("batch_x_channels", "in_area", "out_area", "kernel_area"),
    "avgpool2d": ("batch_x_channels", "in_area", "out_area", "kernel_area"),
    "linear": ("rows", "in_features", "out_features"),
    "matmul": ("batch", "m", "k", "n"),
    "bytes": ("fwd_bytes",),
}


# ---------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """One measured layer: what it is (op, config, shapes) and its forward/backward seconds."""

    op: str
    config: dict[str, Any]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...] | None
    fwd_s: float
    bwd_s: float
    dtype: str = "float32"
    param_bytes: int = 0
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "config": self.config, "in_shapes": [list(s) for s in
                self.in_shapes], "out_shape": list(self.out_shape) if self.out_shape else None,
                "fwd_s": self.fwd_s, "bwd_s": self.bwd_s, "dtype": self.dtype,
                "param_bytes": self.param_bytes, "source": self.source}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Sample":
        return Sample(d["op"], dict(d.get("config", {})), tuple(tuple(s) for s in d["in_shapes"]),
                      tuple(d["out_shape"]) if d.get("out_shape") else None, float(d["fwd_s"]),
                      float(d["bwd_s"]), d.get("dtype", "float32"), int(d.get("param_bytes", 0)),
                      d.get("source", ""))


def samples_from_graph(g: Graph, *, ops: Sequence[str] | None = None) -> list[Sample]:
    """Training samples (node attrs + measured fwd_s/bwd_s) from a profiled graph.

    Skips view-like ops, nodes without recorded input shapes, and nodes with zero forward time.
    Raises :class:`UsageError` when ``g`` was not profiled.
    """
    if g.meta.get("costs") != "profiled":
        raise UsageError(f"graph {g.name!r} has costs {g.meta.get('costs')!r}, not measured ones; "
                         "run outcore.profile on it first")
    out = []
    for i in range(g.num_nodes):
        op = g.op_of(i).lower()
        attrs = g.attrs[i] if g.attrs is not None else {}
        if op in ZERO_COST_OPS or "in_shapes" not in attrs or g.fwd_s[i] <= 0:
            continue
        if ops is not None and op not in ops:
            continue
        shape = first_shape(attrs.get("shape"))
        out.append(Sample(op, dict(attrs.get("config", {})),
                          tuple(tuple(s) for s in attrs["in_shapes"] if isinstance(s, list)),
                          tuple(shape) if shape else None, float(g.fwd_s[i]),
                          float(g.bwd_s[i]), str(attrs.get("dtype", "float32")),
                          int(g.param_bytes[i]), f"{g.name}:{g.name_of(i)}"))
    return out


def family_of(op: str, config: dict[str, Any] | None = None) -> str:
    """The regression family of a layer.

    ``conv2d`` (``conv2d_grouped`` when ``groups > 1``: depthwise kernels behave nothing like
    dense ones), ``linear``, ``matmul`` (``bmm``, ``mm``), else the op name itself.
    """
    op = op.lower()
    fam = _FAMILY_OF.get(op, op)
    if fam == "conv2d" and int((config or {}).get("groups", 1)) > 1:
        return "conv2d_grouped"
    return fam


def _conv_vars(config: dict[str, Any], x: list[int], out_shape: Sequence[int]) -> list[float]:
    x4 = x if len(x) == 4 else [1, *x]
    o4 = list(out_shape) if len(out_shape) == 4 else [1, *out_shape]
    groups = max(int(config.get("groups", 1)), 1)
    cin = int(config.get("in_channels", x4[1]))
    stride = config.get("stride", 1)
    s = [int(v) for v in stride] if isinstance(stride, (list, tuple)) else [int(stride)] * 2
    return [x4[0], cin / groups, o4[1], kernel_elems(config, 2), o4[2] * o4[3], math.prod(s),
            groups]


def variables(op: str, config: dict[str, Any], in_shapes: Sequence[Sequence[int]],
              out_shape: Sequence[int] | None, dtype: str = "float32",
              param_bytes: int = 0) -> tuple[np.ndarray, float, float] | None:
    """(family variables, forward FLOPs, forward bytes) of one layer, or None if unknown.

    Variables per family are listed in ``FAMILY_VARIABLES``; an op without its own list is
    described by its forward bytes.
    """
    fam = family_of(op, config)
    shapes = [list(s) for s in in_shapes]
    x = shapes[0] if shapes else None
    v: list[float] = []
    if fam in ("conv2d", "conv2d_grouped"):
        if x is None or len(x) not in (3, 4) or not out_shape:
            return None
        v = _conv_vars(config, x, out_shape)
        if param_bytes <= 0:
            param_bytes = int((v[2] * v[1] * v[3] + v[2]) * 4)
    elif fam == "linear":
        if x is None:
            return None
        fout = int(config.get("out_features", out_shape[-1] if out_shape else 0))
        v = [math.prod(x[:-1]), int(config.get("in_features", x[-1])), fout]
        out_shape = out_shape or [*x[:-1], fout]
        if param_bytes <= 0:
            param_bytes = int((v[1] * v[2] + v[2]) * 4)
    elif fam == "matmul":
        if len(shapes) < 2 or not out_shape:
            return None
        a, b = shapes[0], shapes[1]
        v = [math.prod(out_shape[:-2]) if len(out_shape) > 2 else 1,
             a[-2] if len(a) > 1 else 1, a[-1], b[-1] if len(b) > 1 else 1]
    elif fam in POOL_FAMILIES:
        if x is None or len(x) < 3 or not out_shape or len(out_shape) < 3:
            return None
        v = [math.prod(x[:-2]), x[-2] * x[-1], out_shape[-2] * out_shape[-1],
             kernel_elems(config, 2)]
    attrs = {"in_shapes": shapes, "shape": list(out_shape) if out_shape else None,
             "config": config, "dtype": dtype}
    out_bytes = math.prod(out_shape) * itemsize(dtype) if out_shape else 0
    w = work(op, attrs, param_bytes=param_bytes, out_bytes=out_bytes)
    if fam not in FAMILY_VARIABLES:
        v = [w.fwd_bytes]
    arr = np.asarray(v, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        return None
    return arr, w.fwd_flops, w.fwd_bytes


# ---------------------------------------------------------------------------- forms


def _exponents(nvars: int, degree: int) -> list[tuple[int, ...]]:
    """All exponent vectors of total degree 1..degree (the constant term is separate)."""
    terms = []
    for d in range(1, degree + 1):
        for combo in itertools.combinations_with_replacement(range(nvars), d):
            e = [0] * nvars
            for j in combo:
                e[j] += 1
            terms.append(tuple(e))
    return terms


@dataclass(frozen=True)
class PolyFit:
    """Polynomial of degree ``degree`` in (log or raw) standardised variables."""

    space: str  # "log" | "raw"
    degree: int
    columns: tuple[int, ...]  # variables that vary in the training data
    mean: tuple[float, ...]
    std: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    terms: tuple[tuple[int, ...], ...]
    coef: tuple[float, ...]  # intercept first

    @property
    def form(self) -> str:
        return f"{self.space}{self.degree}"

    def _design(self, V: np.ndarray) -> np.ndarray:
        X = V[:, list(self.columns)]
        if self.space == "log":
            X = np.log(X)
        Z = (X - np.asarray(self.mean)) / np.asarray(self.std)
        Zc = np.clip(Z, np.asarray(self.lo), np.asarray(self.hi))
        cols = [np.ones(len(V))]
        for e in self.terms:
            base = Z if sum(e) == 1 else Zc
            cols.append(np.prod(base ** np.asarray(e), axis=1))
        return np.column_stack(cols)

    def predict(self, V: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        y = self._design(V) @ np.asarray(self.coef)
        return np.exp(np.clip(y, -40.0, 10.0)) if self.space == "log" else np.maximum(y, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "space": self.space, "degree": self.degree,
                "columns": list(self.columns), "mean": list(self.mean), "std": list(self.std),
                "lo": list(self.lo), "hi": list(self.hi), "terms": [list(t) for t in self.terms],
                "coef": list(self.coef)}


@dataclass(frozen=True)
class WorkFit:
    """``t = c0 + c1 × flops + c2 × bytes`` with non-negative coefficients."""

    coef: tuple[float, float, float]

    @property
    def form(self) -> str:
        return "work"

    def predict(self, V: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        c0, c1, c2 = self.coef
        return np.maximum(c0 + c1 * flops + c2 * nbytes, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {"form": "work", "coef": list(self.coef)}


@dataclass(frozen=True)
class HybridFit:
    """``work`` times a log-polynomial correction: ``t = work(flops, bytes) × exp(poly(log v))``."""

    base: WorkFit
    correction: PolyFit

    @property
    def form(self) -> str:
        return f"wlog{self.correction.degree}"

    def predict(self, V: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return self.base.predict(V, flops, nbytes) * self.correction.predict(V, flops, nbytes)

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "base": self.base.to_dict(),
                "correction": self.correction.to_dict()}


Fit = PolyFit | WorkFit | HybridFit


def _fit_from_dict(d: dict[str, Any]) -> Fit:
    if d.get("form") == "work":
        return WorkFit(tuple(float(c) for c in d["coef"]))  # type: ignore[arg-type]
    if str(d.get("form", "")).startswith("wlog"):
        base, corr = _fit_from_dict(d["base"]), _fit_from_dict(d["correction"])
        assert isinstance(base, WorkFit) and isinstance(corr, PolyFit)
        return HybridFit(base, corr)
    return PolyFit(d["space"], int(d["degree"]), tuple(d["columns"]), tuple(d["mean"]),
                   tuple(d["std"]), tuple(d["lo"]), tuple(d["hi"]),
                   tuple(tuple(t) for t in d["terms"]), tuple(d["coef"]))


def _fit_poly(V: np.ndarray, t: np.ndarray, space: str, degree: int, ridge: float) -> PolyFit:
    X = np.log(V) if space == "log" else V
    spread = X.max(axis=0) - X.min(axis=0)
    columns = tuple(int(j) for j in np.flatnonzero(spread > 1e-12 * (np.abs(X).max(axis=0) + 1)))
    Xs = X[:, list(columns)]
    mean, std = Xs.mean(axis=0), Xs.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    Z = (Xs - mean) / std
    fit = PolyFit(space, degree, columns, tuple(mean), tuple(std), tuple(Z.min(axis=0)),
                  tuple(Z.max(axis=0)), tuple(_exponents(len(columns), degree)), ())
    A = fit._design(V)
    y = np.log(t) if space == "log" else t
    # ridge on all but the intercept: stack sqrt(ridge)·I under the design matrix
    reg = np.sqrt(ridge) * np.eye(A.shape[1])[1:]
    coef, *_ = np.linalg.lstsq(np.vstack([A, reg]), np.concatenate([y, np.zeros(len(reg))]),
                               rcond=None)
    return PolyFit(**{**fit.__dict__, "coef": tuple(float(c) for c in coef)})


def _fit_work(flops: np.ndarray, nbytes: np.ndarray, t: np.ndarray) -> WorkFit:
    """Non-negative least squares on relative error, by dropping negative columns (3 columns)."""
    A = np.column_stack([np.ones_like(t), flops, nbytes]) / t[:, None]
    y = np.ones_like(t)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return WorkFit(tuple(float(c) for c in coef))  # type: ignore[arg-type]


def _fit_rate(flops: np.ndarray, nbytes: np.ndarray, t: np.ndarray) -> WorkFit:
    """One rate, geometric mean of t / work: per FLOP if every sample has FLOPs, else per byte."""
    if np.all(flops > 0):
        return WorkFit((0.0, float(np.exp(np.mean(np.log(t / flops)))), 0.0))
    return WorkFit((0.0, 0.0, float(np.exp(np.mean(np.log(t / nbytes))))))


def _fit_form(form: str, V: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
              t: np.ndarray) -> Fit:
    if form == "work":
        return _fit_work(flops, nbytes, t)
    if form.startswith("wlog"):
        base = _fit_work(flops, nbytes, t)
        degree = int(form[4:])
        residual = t / base.predict(V, flops, nbytes)
        return HybridFit(base, _fit_poly(V, residual, "log", degree, _ridge(degree, len(t))))
    space, degree = form[:3], int(form[3:])
    return _fit_poly(V, t, space, degree, _ridge(degree, len(t)))


def _ridge(degree: int, n: int) -> float:
    return {1: 1e-8, 2: 1e-4, 3: 1e-2}.get(degree, 1e-2) * n


def _n_terms(form: str, nvars: int) -> int:
    if form == "work":
        return 3
    return 1 + len(_exponents(nvars, int(form.lstrip("wlograw"))))


def ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Absolute percentage error, ``100 × |pred - true| / true``."""
    return 100.0 * np.abs(pred - true) / true


def _score(errors: np.ndarray) -> float:
    return 0.5 * (float(np.median(errors)) + float(np.percentile(errors, 90)))


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class CostModel:
    """Fitted per-family predictors of forward and backward seconds.

    Attributes:
        fits: ``{family: {"fwd": Fit, "bwd": Fit}}``.
        cv: ``{family: {"fwd"|"bwd": {form: {"p50": %, "p90": %}}}}`` cross-validation errors.
        n_samples: ``{family: count}`` of training samples.
        device: name of the device the samples were measured on.
    """

    fits: dict[str, dict[str, Fit]]
    cv: dict[str, Any] = field(default_factory=dict)
    n_samples: dict[str, int] = field(default_factory=dict)
    device: str = ""

    @property
    def families(self) -> list[str]:
        return sorted(self.fits)

    def covers(self, op: str, config: dict[str, Any] | None = None) -> bool:
        return family_of(op, config) in self.fits

    def predict(self, op: str, config: dict[str, Any], in_shapes: Sequence[Sequence[int]],
                out_shape: Sequence[int] | None = None, *, dtype: str = "float32",
                param_bytes: int = 0) -> tuple[float, float] | None:
        """(forward seconds, backward seconds) of one layer, or None if the op is not covered.

        Args:
            op: op name (``conv2d``, ``linear``, ...); config: layer hyperparameters as capture
                records them; in_shapes: input tensor shapes; out_shape: output shape (needed
                for conv2d and matmul).
        """
        fam = family_of(op, config)
        if fam not in self.fits or dtype not in ("float32", "float"):
            return None
        found = variables(op, config, in_shapes, out_shape, dtype, param_bytes)
        if found is None:
            return None
        v, flops, nbytes = found
        V, F, B = v[None, :], np.array([flops]), np.array([nbytes])
        f = self.fits[fam]
        return float(f["fwd"].predict(V, F, B)[0]), float(f["bwd"].predict(V, F, B)[0])

    def predict_sample(self, s: Sample) -> tuple[float, float] | None:
        return self.predict(s.op, s.config, s.in_shapes, s.out_shape, dtype=s.dtype,
                            param_bytes=s.param_bytes)

    def summary(self) -> dict[str, Any]:
        """Families, chosen forms and sample counts (for graph metadata and reports)."""
        return {"device": self.device, "families": {
            fam: {"fwd": f["fwd"].form, "bwd": f["bwd"].form, "samples": self.n_samples.get(fam)}
            for fam, f in sorted(self.fits.items())}}

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "device": self.device, "n_samples": self.n_samples,
                "cv": self.cv, "fits": {fam: {d: f.to_dict() for d, f in fits.items()}
                                        for fam, fits in self.fits.items()}}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "CostModel":
        if data.get("format") != FORMAT:
            raise FormatError(f"not a cost model (format {data.get('format')!r}, expected "
                              f"{FORMAT!r}); fit one with outcore.cost.regression.fit")
        fits = {fam: {d: _fit_from_dict(f) for d, f in fs.items()}
                for fam, fs in data["fits"].items()}
        return CostModel(fits, data.get("cv", {}), dict(data.get("n_samples", {})),
                         data.get("device", ""))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> "CostModel":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise FormatError(f"cannot read cost model {path}: {e}") from e
        return CostModel.from_dict(data)


def _arrays(samples: Sequence[Sample]) -> tuple[np.ndarray, ...] | None:
    rows = []
    for s in samples:
        r = variables(s.op, s.config, s.in_shapes, s.out_shape, s.dtype, s.param_bytes)
        if r is not None and s.fwd_s > 0 and s.bwd_s > 0:
            rows.append((r, s))
    if not rows:
        return None
    V = np.vstack([r[0] for r, _ in rows])
    F = np.array([r[1] for r, _ in rows])
    B = np.array([r[2] for r, _ in rows])
    T = np.array([[s.fwd_s, s.bwd_s] for _, s in rows])
    return V, F, B, T


def cross_validate(form: str, V: np.ndarray, F: np.ndarray, B: np.ndarray, t: np.ndarray, *,
                   folds: int = 5, seed: int = 0) -> np.ndarray:
    """Out-of-fold absolute % errors of ``form`` on (V, F, B) → t, one per sample."""
    rng = np.random.default_rng(seed)
    fold = rng.permutation(len(t)) % folds
    errors = np.empty(len(t))
    for k in range(folds):
        test = fold == k
        fit = _fit_form(form, V[~test], F[~test], B[~test], t[~test])
        errors[test] = ape(fit.predict(V[test], F[test], B[test]), t[test])
    return errors


def fit(samples: Sequence[Sample], *, forms: Sequence[str] = DEFAULT_FORMS, folds: int = 5,
        seed: int = 0, device: str = "") -> CostModel:
    """Fit a :class:`CostModel` on measured layers, choosing each family's form by k-fold CV.

    Args:
        samples: measured layers (:func:`samples_from_graph`, or
            :func:`outcore.cost.calibrate.measure_layers`); families with fewer than
            ``MIN_SAMPLES`` usable samples get a single calibrated rate.
        forms: candidate forms (``raw2``, ``raw3``, ``log1``..``log3``, ``work``).
        folds: cross-validation folds; seed: fold assignment seed.
        device: name of the device the samples come from (kept in the model).
    """
    unknown = [f for f in forms if f != "work" and not _FORM.match(f)]
    if unknown or not forms:
        raise UsageError(f"unknown regression form(s) {unknown or forms}; use "
                         f"{', '.join(DEFAULT_FORMS)}")
    by_family: dict[str, list[Sample]] = {}
    for s in samples:
        if s.dtype in ("float32", "float"):
            by_family.setdefault(family_of(s.op, s.config), []).append(s)
    fits: dict[str, dict[str, Fit]] = {}
    cv: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for fam, group in sorted(by_family.items()):
        arrays = _arrays(group)
        if arrays is None:
            continue
        V, F, B, T = arrays
        fits[fam], cv[fam], counts[fam] = {}, {}, len(T)
        n_train = len(T) * (folds - 1) // folds
        candidates = [f for f in forms if _n_terms(f, V.shape[1]) <= n_train]
        if len(T) < MIN_SAMPLES or not candidates:  # too few to choose a form by CV
            form = "work" if len(T) >= 3 else "rate"
            for d, name in enumerate(("fwd", "bwd")):
                fits[fam][name] = (_fit_work(F, B, T[:, d]) if form == "work"
                                   else _fit_rate(F, B, T[:, d]))
                cv[fam][name] = {"chosen": form, "forms": {}}
            log.info("regression: %s has %d samples, too few to cross-validate: fitted %s",
                     fam, len(T), form)
            continue
        for d, name in enumerate(("fwd", "bwd")):
            scores = {}
            for form in candidates:
                err = cross_validate(form, V, F, B, T[:, d], folds=folds, seed=seed)
                scores[form] = {"p50": float(np.median(err)), "p90": float(np.percentile(err, 90)),
                                "score": _score(err)}
            best = min(candidates, key=lambda f: (scores[f]["score"], candidates.index(f)))
            fits[fam][name] = _fit_form(best, V, F, B, T[:, d])
            cv[fam][name] = {"chosen": best, "forms": scores}
            log.info("regression: %s %s -> %s (CV median %.1f%%, p90 %.1f%%, %d samples)", fam,
                     name, best, scores[best]["p50"], scores[best]["p90"], len(T))
    if not fits:
        raise UsageError("no measured sample has recorded shapes and positive forward and "
                         "backward times; measure layers with outcore.cost.calibrate or profile "
                         "a captured graph")
    return CostModel(fits, cv, counts, device)
