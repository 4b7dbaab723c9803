"""Which law does the rank of the weight matrices follow with depth?

Candidate laws r(x) are fitted by least squares on y itself to points (x_i, y_i): x the layer position (1..L), y
the rank or rank fraction of that layer's matrices, so R², adjusted R² and AIC compare across laws.
:func:`fit_laws` fits them all and ranks them; :func:`shown_law` picks the one a report shows (defined, and an
adjusted R² of at least :data:`MIN_ADJ_R2`).

===================  =============================================  ===  ===========================
name                 r(x)                                           k    fitted by
===================  =============================================  ===  ===========================
``linear``           a + b·x                                        2    lstsq (exact)
``quadratic``        a + b·x + c·x²                                 3    lstsq (exact)
``exponential``      a·exp(b·x)                                     2    curve_fit, log-linear start
``power``            a·x^b                                          2    curve_fit, log-log start
``quarter_ellipse``  r_min + (r_max − r_min)·√(1 − (x/L)²)          2    lstsq (exact, L fixed)
===================  =============================================  ===  ===========================

``depth`` (L) defaults to max(x), fixed, not fitted; with x = 1..L the quarter ellipse's deepest layer sits at r_min
and r_max is extrapolated to x = 0 (0-based positions pass ``depth=L``); 1 − (x/L)² is clipped at 0. The exponential
has no offset (a·exp(b·x) + c is poorly identified on 12–48 layers); exponential and power laws need every y > 0
(power every x > 0). An undefined or failed fit is never an exception: a :class:`Fit` with nan coefficients and
scores whose equation says why; bad *input* (shapes, NaN/Inf, an unknown law, depth ≤ 0) raises ValueError. The
scores are :class:`Fit`'s, the order :func:`fit_laws`'s; what the laws show on real models: docs/rank.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

LAWS = ("linear", "quadratic", "exponential", "power", "quarter_ellipse")

_PARAMS: dict[str, tuple[str, ...]] = {
    "linear": ("a", "b"),
    "quadratic": ("a", "b", "c"),
    "exponential": ("a", "b"),
    "power": ("a", "b"),
    "quarter_ellipse": ("r_min", "r_max"),
}
_TEMPLATES = {
    "linear": "r(x) = a + b·x",
    "quadratic": "r(x) = a + b·x + c·x²",
    "exponential": "r(x) = a·exp(b·x)",
    "power": "r(x) = a·x^b",
    "quarter_ellipse": "r(x) = r_min + (r_max − r_min)·√(1 − (x/L)²)",
}
_RSS_FLOOR_REL = 1e-10  # residual RMS below this fraction of max|y| is rounding, for AIC
_DIGITS = 4  # significant digits of a printed coefficient

MIN_ADJ_R2 = 0.5
"""The least adjusted R² at which a fitted law is shown (tables) and drawn (figures).

Below it the law explains too little of how the rank varies across layers to be read as the way the
rank changes with depth: a report says which law came closest and how close, and draws none.
0.5: the law explains at least half of the variance, after the penalty for its parameters."""


@dataclass(frozen=True, kw_only=True)
class Fit:
    """One fitted law and its scores; nan coefficients and scores when the fit is undefined or failed.

    R² = 1 − RSS/SST, nan when SST = 0 (constant y: nothing to explain). Adjusted R² = 1 − (1 − R²)(n − 1)/(n − k − 1),
    nan when n − k − 1 ≤ 0. AIC = n·ln(RSS/n) + 2k with RSS floored at n·(1e-10·max|y|)²: residuals below that are
    rounding, so an exact fit gets a large finite negative AIC (finite for constant y too). ``equation`` prints each
    coefficient to 4 significant digits, never in e-notation, and drops a term whose contribution over the fitted x
    is below half a unit in the 4th digit of the largest term (rounding noise of the fit), so an exactly flat rank
    reads ``r(x) = 6``, not ``r(x) = 6 − 3.33e−16·x``.
    """

    name: str
    coefficients: dict[str, float] = field(hash=False)  # the law's parameters by name (a, b, c, ...)
    equation: str
    r2: float
    adj_r2: float
    aic: float
    n: int
    k: int
    _depth: float | None = field(default=None, repr=False)  # L, for the quarter ellipse only

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The law at ``x`` (float64); nan everywhere for a failed fit, numpy's value off its domain."""
        return _evaluate(self.name, self.coefficients, np.asarray(x, dtype=np.float64), self._depth)


def fit_law(
    name: str, x: np.ndarray | Sequence[float], y: np.ndarray | Sequence[float], *, depth: float | None = None
) -> Fit:
    """Fit one law by least squares on y; ``depth`` (L, quarter ellipse only) defaults to max(x)."""
    if name not in _PARAMS:
        raise ValueError(f"unknown law {name!r}; choose from {', '.join(LAWS)}")
    xs, ys = _points(x, y)
    _check_depth(depth)
    k = len(_PARAMS[name])
    if len(xs) < k:
        return _failed(name, len(xs), k, f"{len(xs)} points for {k} parameters")
    L = None
    if name == "quarter_ellipse":
        L = float(np.max(xs)) if depth is None else float(depth)
        if L <= 0:
            return _failed(name, len(xs), k, f"depth L = max(x) = {L:g} is not positive")
    params, why = _FITTERS[name](xs, ys, L)
    if params is None or not all(np.isfinite(v) for v in params.values()):
        return _failed(name, len(xs), k, why or "the fit did not converge to finite parameters", L)
    return _scored(name, params, xs, ys, L)


def fit_laws(
    x: np.ndarray | Sequence[float],
    y: np.ndarray | Sequence[float],
    *,
    depth: float | None = None,
    laws: Sequence[str] = LAWS,
) -> list[Fit]:
    """Fit every law in ``laws`` and rank them, best first: highest adjusted R², then (ties, e.g. exact fits at 1.0,
    or nan) lowest AIC, so fewer parameters among exact fits, then the order of :data:`LAWS`; nan sorts after every
    number, so failed fits come last."""
    fits = [fit_law(name, x, y, depth=depth) for name in laws]
    order = {name: i for i, name in enumerate(LAWS)}

    def key(f: Fit) -> tuple:
        adj = -f.adj_r2 if not math.isnan(f.adj_r2) else math.inf
        aic = f.aic if not math.isnan(f.aic) else math.inf
        return (adj, aic, order[f.name])

    return sorted(fits, key=key)


def shown_law(fits: Sequence[Fit], *, min_adj_r2: float = MIN_ADJ_R2) -> tuple[Fit | None, str]:
    """The law to show of ``fits`` (the laws fitted to one set of points, e.g. :func:`fit_laws`'s),
    and what a report says about it: ``(fit, "linear, adj. R² 0.93")``, or ``(None, why)``.

    A law is shown only when its adjusted R² is defined, i.e. n ≥ k + 2 points (with fewer, any
    k-parameter law passes through them or nearly: nothing to judge it by) and at least ``min_adj_r2``.
    The reasons: ``too few layers for a law (2)``, ``the same rank at every layer`` (nothing to
    explain), ``no law fits (best adj. R² -0.47)``, ``no law could be fitted``.
    """
    if not fits:
        return None, "no law fitted"
    n = max(f.n for f in fits)
    judged = [f for f in fits if f.n >= f.k + 2]
    if not judged:
        return None, f"too few layers for a law ({n})"
    scored = [f for f in judged if not math.isnan(f.adj_r2)]
    if not scored:
        fitted = [f for f in judged if not math.isnan(f.aic)]  # fitted, but nothing to explain: sst = 0
        return None, "the same rank at every layer" if fitted else "no law could be fitted"
    best = max(scored, key=lambda f: f.adj_r2)  # the first of equals: fit_laws's order breaks ties
    if best.adj_r2 < min_adj_r2:
        return None, f"no law fits (best adj. R² {best.adj_r2:.2f})"
    return best, f"{best.name.replace('_', ' ')}, adj. R² {best.adj_r2:.2f}"


# --- inputs ------------------------------------------------------------------------------------


def _points(x, y) -> tuple[np.ndarray, np.ndarray]:
    """1-D float64 copies of x and y; bad input is the caller's bug, so it raises."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.ndim != 1 or ys.ndim != 1 or xs.shape != ys.shape:
        raise ValueError(f"x and y must be 1-D and of equal length, got shapes {xs.shape} and {ys.shape}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("x and y must be finite (drop layers whose rank is unknown first)")
    return xs, ys


def _check_depth(depth: float | None) -> None:
    if depth is not None and not (math.isfinite(depth) and depth > 0):
        raise ValueError(f"depth must be a positive number of layers, got {depth!r}")


# --- the laws ----------------------------------------------------------------------------------


def _ellipse_s(x: np.ndarray, L: float) -> np.ndarray:
    """√(1 − (x/L)²), clipped at 0 so the law is defined beyond x = L."""
    return np.sqrt(np.clip(1.0 - (x / L) ** 2, 0.0, None))


def _evaluate(name: str, p: dict[str, float], x: np.ndarray, L: float | None) -> np.ndarray:
    with np.errstate(all="ignore"):
        if name == "linear":
            return p["a"] + p["b"] * x
        if name == "quadratic":
            return p["a"] + p["b"] * x + p["c"] * x**2
        if name == "exponential":
            return p["a"] * np.exp(p["b"] * x)
        if name == "power":
            return p["a"] * np.power(x, p["b"])
        if name == "quarter_ellipse":
            if L is None:  # a failed fit keeps no depth
                return np.full(x.shape, np.nan)
            return p["r_min"] + (p["r_max"] - p["r_min"]) * _ellipse_s(x, L)
    raise ValueError(f"unknown law {name!r}")


def _lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Exact least squares, or None when the columns cannot all be identified (rank-deficient)."""
    coef, _, rank, _ = np.linalg.lstsq(A, y, rcond=None)
    return coef if rank == A.shape[1] else None


Fitted = tuple[dict[str, float] | None, str]


def _fit_linear(x: np.ndarray, y: np.ndarray, L: float | None) -> Fitted:
    c = _lstsq(np.column_stack([np.ones_like(x), x]), y)
    return (None, "x does not vary: slope undefined") if c is None else ({"a": c[0], "b": c[1]}, "")


def _fit_quadratic(x: np.ndarray, y: np.ndarray, L: float | None) -> Fitted:
    # Centred and scaled x keeps [1, t, t²] well conditioned; the coefficients are mapped back.
    m, s = float(np.mean(x)), float(np.ptp(x)) or 1.0
    t = (x - m) / s
    c = _lstsq(np.column_stack([np.ones_like(t), t, t**2]), y)
    if c is None:
        return None, "fewer than 3 distinct x: curvature undefined"
    a0, b0, c0 = c
    return {"a": a0 - b0 * m / s + c0 * m**2 / s**2, "b": b0 / s - 2 * c0 * m / s**2, "c": c0 / s**2}, ""


def _fit_ellipse(x: np.ndarray, y: np.ndarray, L: float | None) -> Fitted:
    # Linear in (r_min, r_max) for fixed L: r = r_min·(1 − s) + r_max·s.
    if L is None:
        raise ValueError("the quarter ellipse needs the depth L")
    s = _ellipse_s(x, float(L))
    c = _lstsq(np.column_stack([1.0 - s, s]), y)
    if c is None:
        return None, "√(1 − (x/L)²) is the same at every x: r_min and r_max cannot be separated"
    return {"r_min": c[0], "r_max": c[1]}, ""


def _fit_positive(
    model: Callable[[np.ndarray, float, float], np.ndarray], u: np.ndarray, x: np.ndarray, y: np.ndarray
) -> Fitted:
    """a·g(b, x) by curve_fit on y, started from the straight-line fit of log y against u."""
    from scipy.optimize import curve_fit  # scipy only when a nonlinear law is fitted

    start = _lstsq(np.column_stack([np.ones_like(u), u]), np.log(y))
    if start is None:
        return None, "x does not vary: exponent undefined"
    p0 = [math.exp(start[0]), start[1]]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # OptimizeWarning when the covariance is undefined (n = k)
            (a, b), _ = curve_fit(model, x, y, p0=p0, xtol=1e-12, ftol=1e-12, maxfev=2000)
    except (RuntimeError, ValueError) as err:
        return None, f"curve_fit failed: {err}"
    return {"a": float(a), "b": float(b)}, ""


def _fit_exponential(x: np.ndarray, y: np.ndarray, L: float | None) -> Fitted:
    if np.any(y <= 0):
        return None, "needs every y > 0"
    return _fit_positive(lambda x, a, b: a * np.exp(b * x), x, x, y)


def _fit_power(x: np.ndarray, y: np.ndarray, L: float | None) -> Fitted:
    if np.any(y <= 0) or np.any(x <= 0):
        return None, "needs every x > 0 and y > 0"
    return _fit_positive(lambda x, a, b: a * np.power(x, b), np.log(x), x, y)


_FITTERS: dict[str, Callable[[np.ndarray, np.ndarray, float | None], Fitted]] = {
    "linear": _fit_linear,
    "quadratic": _fit_quadratic,
    "exponential": _fit_exponential,
    "power": _fit_power,
    "quarter_ellipse": _fit_ellipse,
}


# --- scores and equations ----------------------------------------------------------------------


def _scored(name: str, params: dict[str, float], x: np.ndarray, y: np.ndarray, L: float | None) -> Fit:
    n, k = len(y), len(params)
    params = {key: float(v) for key, v in params.items()}
    rss = float(np.sum((y - _evaluate(name, params, x, L)) ** 2))
    sst = float(np.sum((y - np.mean(y)) ** 2))
    r2 = 1.0 - rss / sst if sst > 0 else math.nan
    adj = 1.0 - (1.0 - r2) * (n - 1) / (n - k - 1) if n - k - 1 > 0 else math.nan
    scale = float(np.max(np.abs(y))) or 1.0
    floor = n * (_RSS_FLOOR_REL * scale) ** 2
    aic = n * math.log(max(rss, floor) / n) + 2 * k
    return Fit(
        name=name,
        coefficients=params,
        equation=_equation(name, params, L, x),
        r2=r2,
        adj_r2=adj,
        aic=aic,
        n=n,
        k=k,
        _depth=L,
    )


def _failed(name: str, n: int, k: int, why: str, L: float | None = None) -> Fit:
    params = {p: math.nan for p in _PARAMS[name]}
    return Fit(
        name=name,
        coefficients=params,
        equation=f"{_TEMPLATES[name]} (not fitted: {why})",
        r2=math.nan,
        adj_r2=math.nan,
        aic=math.nan,
        n=n,
        k=k,
        _depth=L,
    )


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _num(v: float) -> str:
    """4 significant digits with a true minus sign, never e-notation: 12350, 0.0001234, 1.5×10⁻⁷."""
    if v == 0:
        return "0"
    mantissa, exponent = f"{v:.{_DIGITS - 1}e}".split("e")
    e = int(exponent)
    if -5 <= e < 6:
        text = f"{float(f'{v:.{_DIGITS - 1}e}'):.{max(_DIGITS - 1 - e, 0)}f}"
        text = text.rstrip("0").rstrip(".") if "." in text else text
    else:
        text = f"{mantissa.rstrip('0').rstrip('.')}×10{str(e).translate(_SUPERSCRIPT)}"
    return text.replace("-", "−")


def _unit(scale: float) -> float:
    """Half a unit in the last printed digit of a number of size ``scale``: what rounding hides."""
    return 0.5 * 10.0 ** (math.floor(math.log10(scale)) - (_DIGITS - 1)) if scale > 0 else 0.0


def _sum(terms: list[tuple[float, str, float]]) -> str:
    """``a + b·x − c·x²`` of (coefficient, factor, size of the term over x), dropping each term smaller
    than the rounding of the largest; ``0`` when nothing is left."""
    hidden = _unit(max(size for _, _, size in terms))
    kept = [(c, factor) for c, factor, size in terms if size > hidden and c != 0]
    if not kept:
        return "0"
    (c0, f0), rest = kept[0], kept[1:]
    return f"{_num(c0)}{f0}" + "".join(f" {'−' if c < 0 else '+'} {_num(abs(c))}{f}" for c, f in rest)


def _equation(name: str, p: dict[str, float], L: float | None, x: np.ndarray) -> str:
    hi_x = float(np.max(np.abs(x))) if len(x) else 1.0
    if name == "linear":
        return "r(x) = " + _sum([(p["a"], "", abs(p["a"])), (p["b"], "·x", abs(p["b"]) * hi_x)])
    if name == "quadratic":
        terms = [(p["a"], "", abs(p["a"])), (p["b"], "·x", abs(p["b"]) * hi_x), (p["c"], "·x²", abs(p["c"]) * hi_x**2)]
        return "r(x) = " + _sum(terms)
    a, b = p.get("a", 0.0), p.get("b", 0.0)
    if name in ("exponential", "power"):
        with np.errstate(all="ignore"):
            g = np.exp(b * x) if name == "exponential" else np.power(x, b)  # x > 0 for a fitted power law
        moved = float(np.max(np.abs(a * (g - 1.0)))) if len(x) else 0.0  # how far the factor takes r from a
        shown_b = _num(b) if moved > _unit(abs(a)) else "0"
        return f"r(x) = {_num(a)}·exp({shown_b}·x)" if name == "exponential" else f"r(x) = {_num(a)}·x^{shown_b}"
    lo, hi = p["r_min"], p["r_max"]
    hidden = _unit(max(abs(lo), abs(hi)))
    lo = 0.0 if abs(lo) <= hidden else lo
    hi = 0.0 if abs(hi) <= hidden else hi
    root = f"√(1 − (x/{_num(float(L or 0))})²)"
    if lo == 0:
        return f"r(x) = {_num(hi)}·{root}"
    return f"r(x) = {_num(lo)} + ({_num(hi)} {'+' if lo < 0 else '−'} {_num(abs(lo))})·{root}"
