"""Laws of rank against depth: parameters recovered, the true law selected, scores by hand, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelvec.analyse.laws import LAWS, MIN_ADJ_R2, Fit, fit_law, fit_laws, shown_law


def truth(name: str, p: dict[str, float], x: np.ndarray, L: float | None = None) -> np.ndarray:
    """The laws written out independently of the module, to generate data and check predict."""
    if name == "linear":
        return p["a"] + p["b"] * x
    if name == "quadratic":
        return p["a"] + p["b"] * x + p["c"] * x**2
    if name == "exponential":
        return p["a"] * np.exp(p["b"] * x)
    if name == "power":
        return p["a"] * x ** p["b"]
    assert name == "quarter_ellipse"
    return p["r_min"] + (p["r_max"] - p["r_min"]) * np.sqrt(np.maximum(1 - (x / L) ** 2, 0))


def layers(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.float64)


# (law, params, number of layers): ranks of a 768-wide model, and rank fractions.
CASES = [
    ("linear", {"a": 12.3, "b": 4.56}, 12),
    ("linear", {"a": 700.0, "b": -9.5}, 24),
    ("linear", {"a": 0.2, "b": 0.03}, 24),
    ("quadratic", {"a": 30.0, "b": -6.0, "c": 0.5}, 12),
    ("quadratic", {"a": 300.0, "b": 40.0, "c": -1.6}, 24),
    ("quadratic", {"a": 0.9, "b": -0.08, "c": 0.004}, 24),
    ("exponential", {"a": 5.0, "b": 0.2}, 12),
    ("exponential", {"a": 700.0, "b": -0.09}, 24),
    ("exponential", {"a": 0.95, "b": -0.06}, 24),
    ("power", {"a": 5.0, "b": 0.6}, 12),
    ("power", {"a": 700.0, "b": -0.45}, 24),
    ("power", {"a": 0.3, "b": 0.35}, 24),
    ("quarter_ellipse", {"r_min": 2.0, "r_max": 10.0}, 12),
    ("quarter_ellipse", {"r_min": 120.0, "r_max": 760.0}, 24),
    ("quarter_ellipse", {"r_min": 0.9, "r_max": 0.1}, 24),  # rising with depth
]
IDS = [f"{law}-{i}" for i, (law, _, _) in enumerate(CASES)]


def noise_sd(y: np.ndarray, rel: float) -> float:
    """``rel`` times the spread of y (or of |y| when y is nearly flat)."""
    return rel * max(float(np.ptp(y)), 0.1 * float(np.mean(np.abs(y))))


def noisy(y: np.ndarray, rel: float, seed: int) -> np.ndarray:
    """y plus seeded Gaussian noise of sd ``noise_sd(y, rel)``."""
    return y + np.random.default_rng(seed).normal(0.0, noise_sd(y, rel), size=y.shape)


def standard_errors(law: str, p: dict[str, float], x: np.ndarray, L: float, sd: float) -> dict[str, float]:
    """Least-squares standard errors of the parameters, sd·√diag((JᵀJ)⁻¹), J by central differences."""
    cols = []
    for key in p:
        h = 1e-6 * max(abs(p[key]), 1e-3)
        up, down = dict(p, **{key: p[key] + h}), dict(p, **{key: p[key] - h})
        cols.append((truth(law, up, x, L) - truth(law, down, x, L)) / (2 * h))
    J = np.column_stack(cols)
    return dict(zip(p, sd * np.sqrt(np.diag(np.linalg.inv(J.T @ J)))))


def rss(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.sum((y - pred) ** 2))


# --- parameter recovery ------------------------------------------------------------------------


@pytest.mark.parametrize("law,params,L", CASES, ids=IDS)
def test_exact_data_recovers_parameters(law, params, L):
    x = layers(L)
    fit = fit_law(law, x, truth(law, params, x, L))
    assert fit.name == law and fit.n == L and fit.k == len(params)
    assert set(fit.coefficients) == set(params)
    for key, value in params.items():
        assert fit.coefficients[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("law,params,L", CASES, ids=IDS)
def test_noisy_data_recovers_parameters_at_the_least_squares_optimum(law, params, L):
    x = layers(L)
    clean = truth(law, params, x, L)
    y = noisy(clean, 0.005, seed=L + len(law))
    fit = fit_law(law, x, y)
    se = standard_errors(law, params, x, L, noise_sd(clean, 0.005))
    for key, value in params.items():
        # within 4 standard errors of the truth, and those are small: the check has teeth
        assert abs(fit.coefficients[key] - value) <= 4 * se[key], key
        assert 4 * se[key] < 0.2 * abs(value), key
    # a least-squares fit is at least as close to the data as the true law is
    fitted = fit.predict(x)
    assert rss(y, fitted) <= rss(y, clean) * (1 + 1e-9)
    # and a tiny step in any parameter does not improve it (a local optimum, not just a good start)
    for key in params:
        for step in (1 + 1e-4, 1 - 1e-4):
            moved = dict(fit.coefficients, **{key: fit.coefficients[key] * step})
            assert rss(y, truth(law, moved, x, L)) >= rss(y, fitted) * (1 - 1e-12)


def test_linear_and_quadratic_match_polyfit_on_noisy_data():
    x = layers(24)
    y = noisy(0.5 * x**2 - 3 * x + 40, 0.05, seed=3)
    b, a = np.polyfit(x, y, 1)
    lin = fit_law("linear", x, y)
    assert (lin.coefficients["a"], lin.coefficients["b"]) == pytest.approx((a, b), rel=1e-10)
    c2, b2, a2 = np.polyfit(x, y, 2)
    quad = fit_law("quadratic", x, y)
    assert (quad.coefficients["a"], quad.coefficients["b"], quad.coefficients["c"]) == pytest.approx(
        (a2, b2, c2), rel=1e-9
    )


def test_quadratic_is_accurate_far_from_the_origin():
    # positions 10001..10024 make [1, x, x²] ill conditioned (uncentred lstsq is off by ~1e-10);
    # the fit centres and scales x first
    x = np.arange(10001, 10025, dtype=np.float64)
    p = {"a": 5.0, "b": -0.3, "c": 2e-4}
    fit = fit_law("quadratic", x, truth("quadratic", p, x))
    np.testing.assert_allclose(fit.predict(x), truth("quadratic", p, x), rtol=1e-13)


# --- the quarter ellipse's convention ------------------------------------------------------------


def test_quarter_ellipse_with_one_based_layers_ends_at_r_min():
    x = layers(12)
    fit = fit_law("quarter_ellipse", x, truth("quarter_ellipse", {"r_min": 64.0, "r_max": 512.0}, x, 12))
    assert fit.predict(np.array([12.0]))[0] == pytest.approx(64.0)
    assert fit.predict(np.array([0.0]))[0] == pytest.approx(512.0)
    assert fit.equation == "r(x) = 64 + (512 − 64)·√(1 − (x/12)²)"


def test_quarter_ellipse_with_zero_based_layers_uses_the_depth_given():
    x = np.arange(12, dtype=np.float64)  # 0..L−1
    p = {"r_min": 64.0, "r_max": 512.0}
    y = truth("quarter_ellipse", p, x, 12)
    fit = fit_law("quarter_ellipse", x, y, depth=12)
    assert fit.coefficients == pytest.approx(p)
    assert fit.predict(np.array([0.0]))[0] == pytest.approx(512.0)
    # the default depth, max(x) = 11, is another law: it does not reproduce these points
    assert fit_law("quarter_ellipse", x, y).r2 < 0.9999


def test_quarter_ellipse_is_defined_beyond_the_depth():
    x = layers(16)
    p = {"r_min": 10.0, "r_max": 90.0}
    y = truth("quarter_ellipse", p, x, 12)  # layers 12..16 sit on the clipped flat part
    fit = fit_law("quarter_ellipse", x, y, depth=12)
    assert fit.coefficients == pytest.approx(p)
    np.testing.assert_allclose(fit.predict(np.array([12.0, 13.0, 40.0])), 10.0)
    assert np.all(np.isfinite(fit.predict(x)))


# --- model selection -----------------------------------------------------------------------------

# For each law: a strongly shaped instance, and a law that is clearly wrong for it.
SELECTION = [
    ("linear", {"a": 700.0, "b": -20.0}, "quarter_ellipse"),
    ("quadratic", {"a": 0.9, "b": -0.12, "c": 0.005}, "linear"),
    ("exponential", {"a": 700.0, "b": -0.15}, "linear"),
    ("power", {"a": 700.0, "b": -0.7}, "linear"),
    ("quarter_ellipse", {"r_min": 40.0, "r_max": 760.0}, "linear"),
]


@pytest.mark.parametrize("law,params,wrong", SELECTION, ids=[s[0] for s in SELECTION])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_laws_selects_the_true_law(law, params, wrong, seed):
    x = layers(24)
    y = noisy(truth(law, params, x, 24), 0.01, seed)
    ranked = fit_laws(x, y)
    assert sorted(f.name for f in ranked) == sorted(LAWS)
    by_name = {f.name: f for f in ranked}
    best, true = ranked[0], by_name[law]
    # the true law is first, or beaten only by a law with more parameters, by a hair
    assert best.name == law or (best.k > true.k and true.adj_r2 >= best.adj_r2 - 0.01)
    # a clearly wrong law is ranked below the true law, by a clear margin
    names = [f.name for f in ranked]
    assert names.index(wrong) > names.index(law)
    assert by_name[wrong].adj_r2 < true.adj_r2 - 0.05
    # best first by adjusted R²
    adj = [f.adj_r2 for f in ranked]
    assert adj == sorted(adj, reverse=True)


def test_exact_fits_tie_and_the_simpler_law_wins():
    # linear data: the quadratic fits as exactly, so adj R² ties (1.0) and AIC/k break it
    x = layers(12)
    ranked = fit_laws(x, 12.3 + 4.56 * x)
    assert [f.name for f in ranked[:2]] == ["linear", "quadratic"]
    assert ranked[0].aic < ranked[1].aic
    assert ranked[0].aic == pytest.approx(ranked[1].aic - 2)  # both at the rounding floor: only 2k differs
    assert ranked[0].equation == "r(x) = 12.3 + 4.56·x"


def test_aic_decides_when_adjusted_r2_is_undefined():
    # n = 3 = k + 1 for the two-parameter laws: adjusted R² is nan, so AIC ranks them; the exact
    # ellipse comes before the linear law although LAWS lists linear first
    x = layers(3)
    ranked = fit_laws(x, truth("quarter_ellipse", {"r_min": 10.0, "r_max": 90.0}, x, 3))
    two = [f for f in ranked if f.k == 2]
    assert all(math.isnan(f.adj_r2) for f in ranked)
    assert two[0].name == "quarter_ellipse"
    assert [f.aic for f in two] == sorted(f.aic for f in two)
    assert two[0].aic < two[1].aic - 10


def test_fit_laws_subset_and_failed_fits_last():
    x = layers(12)
    y = 100 - 8 * x  # reaches 4 at x = 12: positive; then one zero rank
    y[-1] = 0.0
    ranked = fit_laws(x, y, laws=("power", "linear", "exponential"))
    assert [f.name for f in ranked] == ["linear", "exponential", "power"]  # failed: in LAWS order
    assert math.isfinite(ranked[0].adj_r2)
    assert all(math.isnan(f.adj_r2) for f in ranked[1:])
    assert fit_laws(x, y, laws=()) == []


# --- scores by hand ------------------------------------------------------------------------------


def test_scores_match_the_formulas_for_a_linear_fit():
    x = layers(12)
    y = noisy(20 + 3 * x, 0.1, seed=7)
    fit = fit_law("linear", x, y)
    b, a = np.polyfit(x, y, 1)
    n, k = 12, 2
    res = float(np.sum((y - (a + b * x)) ** 2))
    sst = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - res / sst
    assert (fit.n, fit.k) == (n, k)
    assert fit.r2 == pytest.approx(r2, rel=1e-12)
    assert fit.adj_r2 == pytest.approx(1 - (1 - r2) * (n - 1) / (n - k - 1), rel=1e-12)
    assert fit.aic == pytest.approx(n * math.log(res / n) + 2 * k, rel=1e-12)
    assert 0.9 < fit.r2 < 1 and fit.adj_r2 < fit.r2


@pytest.mark.parametrize("law", LAWS)
def test_scores_are_those_of_predict(law):
    x = layers(24)
    y = noisy(truth("quarter_ellipse", {"r_min": 40.0, "r_max": 760.0}, x, 24), 0.02, seed=11)
    fit = fit_law(law, x, y)
    res = rss(y, fit.predict(x))
    sst = float(np.sum((y - y.mean()) ** 2))
    assert fit.r2 == pytest.approx(1 - res / sst, rel=1e-10)
    assert fit.aic == pytest.approx(24 * math.log(res / 24) + 2 * fit.k, rel=1e-10)


# --- predict -------------------------------------------------------------------------------------


@pytest.mark.parametrize("law,params,L", CASES, ids=IDS)
def test_predict_reproduces_the_fitted_values(law, params, L):
    x = layers(L)
    y = noisy(truth(law, params, x, L), 0.01, seed=5)
    fit = fit_law(law, x, y)
    pred = fit.predict(x)
    assert pred.shape == x.shape and pred.dtype == np.float64
    np.testing.assert_allclose(pred, truth(law, fit.coefficients, x, L), rtol=1e-12, atol=1e-12)
    # between layers too, and from a list
    half = x[:-1] + 0.5
    np.testing.assert_allclose(fit.predict(list(half)), truth(law, fit.coefficients, half, L), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "law,params,L,equation",
    [
        ("linear", {"a": 12.34, "b": 4.567}, 12, "r(x) = 12.34 + 4.567·x"),
        ("linear", {"a": 700.0, "b": -9.5}, 24, "r(x) = 700 − 9.5·x"),
        ("quadratic", {"a": 300.0, "b": 40.0, "c": -1.625}, 24, "r(x) = 300 + 40·x − 1.625·x²"),
        ("exponential", {"a": 700.0, "b": -0.09}, 24, "r(x) = 700·exp(−0.09·x)"),
        ("power", {"a": 0.3, "b": 0.35}, 24, "r(x) = 0.3·x^0.35"),
        ("quarter_ellipse", {"r_min": 0.9, "r_max": 0.125}, 24, "r(x) = 0.9 + (0.125 − 0.9)·√(1 − (x/24)²)"),
    ],
)
def test_equation_is_filled_with_the_fitted_numbers(law, params, L, equation):
    x = layers(L)
    assert fit_law(law, x, truth(law, params, x, L)).equation == equation


# --- edge cases ----------------------------------------------------------------------------------


def test_constant_ranks_do_not_crash():
    x = layers(12)
    ranked = fit_laws(x, np.full(12, 64.0))
    assert len(ranked) == len(LAWS)
    for f in ranked:
        assert math.isnan(f.r2) and math.isnan(f.adj_r2)  # nothing to explain
        assert math.isfinite(f.aic)  # exact fits sit at the rounding floor
        np.testing.assert_allclose(f.predict(x), 64.0, rtol=1e-9)
    # among exact fits, the ones with fewer parameters first
    assert ranked[-1].name == "quadratic"
    assert ranked[0].name == "linear"


def test_power_and_exponential_with_a_zero_rank_are_undefined():
    x = layers(12)
    y = np.linspace(300, 0, 12)
    for law in ("power", "exponential"):
        fit = fit_law(law, x, y)
        assert math.isnan(fit.r2) and math.isnan(fit.adj_r2) and math.isnan(fit.aic)
        assert all(math.isnan(v) for v in fit.coefficients.values())
        assert "not fitted" in fit.equation and "y > 0" in fit.equation
        assert np.all(np.isnan(fit.predict(x)))
    assert fit_law("linear", x, y).r2 == pytest.approx(1.0)


def test_power_with_a_layer_at_zero_is_undefined():
    x = np.arange(12, dtype=np.float64)
    fit = fit_law("power", x, 5 + x)
    assert math.isnan(fit.adj_r2) and "x > 0" in fit.equation


def test_fewer_points_than_parameters():
    fit = fit_law("quadratic", [1.0, 2.0], [10.0, 8.0])
    assert (fit.n, fit.k) == (2, 3)
    assert math.isnan(fit.r2) and math.isnan(fit.adj_r2) and math.isnan(fit.aic)
    assert "2 points for 3 parameters" in fit.equation
    # as many points as parameters: an exact fit, but no degrees of freedom for adjusted R²
    lin = fit_law("linear", [1.0, 2.0], [10.0, 8.0])
    assert lin.coefficients == pytest.approx({"a": 12.0, "b": -2.0})
    assert lin.r2 == pytest.approx(1.0) and math.isnan(lin.adj_r2)
    assert math.isnan(fit_law("linear", [1.0, 2.0, 3.0], [10.0, 8.0, 7.0]).adj_r2)  # n − k − 1 = 0
    for f in fit_laws([], []):
        assert f.n == 0 and math.isnan(f.adj_r2)


def test_one_layer_position_cannot_identify_a_slope():
    x = np.full(5, 3.0)
    y = np.array([10.0, 11, 9, 10, 10])
    for law in LAWS:
        fit = fit_law(law, x, y)
        assert math.isnan(fit.adj_r2) and "not fitted" in fit.equation, law


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unknown law"):
        fit_law("cubic", layers(3), layers(3))
    with pytest.raises(ValueError, match="equal length"):
        fit_law("linear", layers(3), layers(4))
    with pytest.raises(ValueError, match="finite"):
        fit_law("linear", layers(3), [1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="depth"):
        fit_laws(layers(3), layers(3), depth=0)


def test_fit_is_frozen_and_hashable():
    fit = fit_law("linear", layers(4), [1.0, 2.0, 3.5, 4.0])
    assert isinstance(fit, Fit)
    with pytest.raises(AttributeError):
        fit.r2 = 0.0  # type: ignore[misc]
    hash(fit)


# --- equations without rounding noise ---------------------------------------------------------------


def test_equation_of_two_equal_ranks_has_no_rounding_noise():
    # 2 layers of rank 6: the slope lstsq finds is ~1e-16, a rounding error, not a term
    fits = fit_laws([1.0, 2.0], [6.0, 6.0])
    by_name = {f.name: f for f in fits}
    assert abs(by_name["linear"].coefficients["b"]) < 1e-12  # the noise is there in the parameters...
    assert by_name["linear"].equation == "r(x) = 6"  # ...not in the equation
    assert by_name["exponential"].equation == "r(x) = 6·exp(0·x)"
    assert by_name["power"].equation == "r(x) = 6·x^0"


def test_a_term_hidden_by_rounding_is_dropped_and_a_visible_one_kept():
    x = layers(12)
    quad = fit_law("quadratic", x, 12.3 + 4.56 * x)  # linear data: c is rounding noise
    assert abs(quad.coefficients["c"]) < 1e-9 and quad.equation == "r(x) = 12.3 + 4.56·x"
    kept = fit_law("quadratic", x, 12.3 + 4.56 * x + 0.01 * x**2)  # 0.01·144 = 1.44: visible
    assert kept.equation == "r(x) = 12.3 + 4.56·x + 0.01·x²"
    through_zero = fit_law("linear", x, 0.37 * x)  # the intercept is noise
    assert through_zero.equation == "r(x) = 0.37·x"
    ellipse = fit_law("quarter_ellipse", x, truth("quarter_ellipse", {"r_min": 0.0, "r_max": 0.9}, x, 12))
    assert ellipse.equation == "r(x) = 0.9·√(1 − (x/12)²)"


@pytest.mark.parametrize(
    "y, equation",
    [
        (lambda x: 12345.6 + 0 * x, "r(x) = 12350"),  # 4 significant digits, no e+04
        (lambda x: 2e-7 * x, "r(x) = 2×10⁻⁷·x"),  # a real coefficient that small: no e-07 either
        (lambda x: 0.000123 * x, "r(x) = 0.000123·x"),
    ],
)
def test_equation_numbers_never_use_e_notation(y, equation):
    x = layers(12)
    assert fit_law("linear", x, y(x)).equation == equation


@pytest.mark.parametrize("seed", range(20))
def test_printed_equations_agree_with_the_fit_to_their_rounding(seed):
    """Noisy ranks of every kind: each printed equation, read back, predicts what the fit predicts to within
    the rounding of its largest term, and has no e-notation."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 40))
    x = layers(n)
    law, params, _ = CASES[seed % len(CASES)]
    y = np.abs(noisy(truth(law, params, x, n), float(rng.uniform(0.0, 0.5)), seed)) + 1e-3
    for fit in fit_laws(x, y):
        assert "e-" not in fit.equation and "e+" not in fit.equation and "nan" not in fit.equation
        if fit.name not in ("linear", "quadratic") or math.isnan(fit.r2):
            continue
        expr = fit.equation.removeprefix("r(x) = ").replace("−", "-").replace("·x²", "*x**2").replace("·x", "*x")
        printed = eval(expr, {"x": x})  # only numbers, + - * and x
        pred = fit.predict(x)
        scale = max(abs(v) * (float(np.max(x)) ** i) for i, v in enumerate(fit.coefficients.values()))
        np.testing.assert_allclose(printed, pred, rtol=0, atol=3e-3 * scale)


# --- which law is shown --------------------------------------------------------------------------------


def test_min_adj_r2_is_a_stated_threshold():
    assert 0 < MIN_ADJ_R2 < 1
    import modelvec.analyse.laws as laws

    assert "MIN_ADJ_R2" in (laws.__doc__ or "")


def test_shown_law_is_the_best_only_when_its_adjusted_r2_reaches_the_threshold():
    x = layers(12)
    fits = fit_laws(x, noisy(20 + 3 * x, 0.05, seed=2))
    law, verdict = shown_law(fits)
    assert law is fits[0] and law.adj_r2 >= MIN_ADJ_R2
    assert verdict == f"{law.name.replace('_', ' ')}, adj. R² {law.adj_r2:.2f}"
    above = law.adj_r2 + 1e-9
    assert shown_law(fits, min_adj_r2=above) == (None, f"no law fits (best adj. R² {law.adj_r2:.2f})")


def test_noise_has_no_law_and_says_how_close_the_best_came():
    x = layers(12)
    y = 100 + np.random.default_rng(4).normal(0, 10, 12)  # ranks that are noise around a constant
    fits = fit_laws(x, y)
    best = max(f.adj_r2 for f in fits if not math.isnan(f.adj_r2))
    assert best < 0  # worse than the mean: a negative adjusted R²
    assert shown_law(fits) == (None, f"no law fits (best adj. R² {best:.2f})")
    assert "-" in shown_law(fits)[1]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_too_few_layers_for_any_law(n):
    # k + 2 points are needed for an adjusted R²: 4 for the two-parameter laws
    fits = fit_laws(layers(n), [6.0, 7.0, 9.0][:n])
    assert shown_law(fits) == (None, f"too few layers for a law ({n})")


def test_four_layers_are_enough_for_a_two_parameter_law_but_not_the_quadratic():
    x = layers(4)
    fits = fit_laws(x, 3.0 + 2.0 * x + np.array([0.1, -0.1, -0.1, 0.1]))
    law, _ = shown_law(fits)
    assert law is not None and law.k == 2
    assert shown_law(fit_laws(x, 3.0 + 2.0 * x, laws=("quadratic",))) == (None, "too few layers for a law (4)")


def test_the_same_rank_at_every_layer_has_no_law_to_show():
    fits = fit_laws(layers(12), np.full(12, 64.0))
    assert shown_law(fits) == (None, "the same rank at every layer")
    failed = fit_laws(layers(12), np.zeros(12), laws=("power", "exponential"))  # neither can be fitted
    assert shown_law(failed) == (None, "no law could be fitted")
    assert shown_law([]) == (None, "no law fitted")


def test_a_nan_adjusted_r2_is_never_shown():
    nan_fit = Fit(
        name="linear",
        coefficients={"a": 1.0, "b": 2.0},
        equation="r(x) = 1 + 2·x",
        r2=math.nan,
        adj_r2=math.nan,
        aic=3.0,
        n=12,
        k=2,
    )
    assert shown_law([nan_fit]) == (None, "the same rank at every layer")
