"""Scaling-law forms fitted jointly across arms, their held-out checks and each arm's loss-vs-compute curve.

The arms of a ladder study are trained on the same data with the same tokenizer, so they share the loss no
model can go below (the data's entropy): one E for all of them (Hoffmann et al. 2022 fit E once; OLMo-core's
ladder analysis fixes it with ``--fix-params``). Each form says which parameters the arms share::

    form                  L of arm k                                           shared across arms
    per_arm               E_k + A_k·C^(−α_k)                                   nothing (three per arm)
    shared_e              E + A_k·C^(−α_k)                                     E
    shared_e_alpha        E + A_k·C^(−α)                                       E, α
    nd_per_arm            E_k + A_k·N^(−a_k) + B_k·D^(−b_k)                    nothing (five per arm)
    nd_shared_e           E + A_k·N^(−a_k) + B_k·D^(−b_k)                      E
    nd_shared_exponents   E + A_k·N^(−a) + B_k·D^(−b)                          E, a, b

C is training compute (FLOPs/token × tokens), N the parameter count a budget is a multiple of (``ladder.params``),
D tokens (Hoffmann et al. 2022, eq. 2). The L(N, D) forms need several budgets per rung (``ladder.budgets``):
with one budget D ∝ N and a, b, A, B cannot be told apart.

Fit: Huber_δ on log L, δ = 1e-3 (Hoffmann et al. approach 3), all arms' runs in one objective, bounded
parameters (0 ≤ E ≤ max L; amplitudes 1e-6..1e3 × max L at the reference point; exponents 1e-3..3), the best of
a grid of starting points. The minimiser is the batched Levenberg–Marquardt on the Huber loss's iteratively
reweighted least squares, projected onto the box (:func:`lm_huber`), run on every bootstrap resample × start at
once; a form with nothing shared is fitted arm by arm (the same optimum, and each arm its own best start).
Inputs are centred (C/C_ref, N/N_ref, D/D_ref at the geometric means of all points) so parameters have similar
scales; amplitudes are returned in raw units.

Each arm's curve in compute. L(C) forms: the fit itself. L(N, D) forms: the best allocation of C within the
tokens per parameter the arm's runs trained, L(C) = min_N L(N, C/f(N)) over r_lo ≤ D/N ≤ r_hi (the band of its
fitted cells: tokens_per_param × the smallest and largest budget), f(N) the arm's FLOPs per token as a function
of N, taken as the power law f = e^(c0)·N^s fitted through its rungs (6N plus the attention term: s a little
below 1; within a few percent at every rung). With T1 = A·N^(−a), T2 = B·D^(−b) the unconstrained optimum has
a·T1 = b·s·T2: the compute-optimal frontier L*(C) = E + G·C^(−γ), γ = a·b/(a + b·s) (Hoffmann et al. 2022,
eq. 4), which the curve is wherever that optimum's D/N lies inside the band. Outside it the frontier rests on
allocations no run trained: with a 5x span of sizes a size exponent a can sit at its bound, and the frontier
then trains a model of a few parameters for ever, so its multiplier says nothing about the rungs; the curve
follows the band's edge instead (L is convex in log N at fixed C, so the clipped optimum is the constrained one).
A compute multiplier inverts the baseline's curve numerically (:func:`allocation_log_multiplier`); the L(C)
forms' in closed form (analysis/compute/scaling.py).

With shared E and α the multiplier is a constant, (A_base/A_X)^(1/α); with shared E and exponents the
frontiers share γ and the multiplier is constant too (inside the band).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lm_ablate.validation import FIT_FORMS

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, appendix D.2
MAX_ITER = 500
FTOL = 1e-13  # relative objective decrease below which a problem counts as converged
BOOT_FTOL = 1e-10  # the same for bootstrap refits (their percentiles agree with FTOL's to 4 digits, 30% faster)
BOOT_CHECKED = 20  # bootstrap resamples also started from the grid's corners, to check the one start
AGREE = 1e-6  # starting points whose objectives are within this (relative) of the best reached the optimum
ALPHA_BOUNDS = (1e-3, 3.0)
A_RANGE = (1e-6, 1e3)
START_E = (0.0, 0.5, 0.8, 0.95)  # × min loss
START_ALPHA = (0.1, 0.3, 0.8)
START_EXPONENTS = ((0.2, 0.2), (0.5, 0.2), (0.2, 0.5), (0.5, 0.5))  # (a, b) for L(N, D)

C_PARAMS = ("E", "a", "alpha")  # per point: E, log A' (at C_ref), α
ND_PARAMS = ("E", "a", "alpha_n", "b", "beta_d")  # E, log A' (at N_ref), a, log B' (at D_ref), b
MIN_RUNGS = 3  # rungs every arm needs in any form (a ladder's minimum: lm_ablate/validation.py)
EXPONENTS = frozenset({"alpha", "alpha_n", "beta_d"})
AMPLITUDES = frozenset({"a", "b"})


@dataclass(frozen=True)
class Form:
    name: str
    kind: str  # "C": L(C); "ND": L(N, D)
    shared: tuple[str, ...]  # per-point parameters the arms share

    @property
    def components(self) -> tuple[str, ...]:
        return C_PARAMS if self.kind == "C" else ND_PARAMS

    @property
    def separable(self) -> bool:
        return not self.shared

    def layout(self, n_arms: int) -> tuple[np.ndarray, list[str]]:
        """(index (n_arms, components) into θ, θ's names): shared components first, then each arm's own."""
        names = list(self.shared)
        index = np.zeros((n_arms, len(self.components)), dtype=int)
        for j, c in enumerate(self.components):
            if c in self.shared:
                index[:, j] = names.index(c)
        for k in range(n_arms):
            for j, c in enumerate(self.components):
                if c not in self.shared:
                    index[k, j] = len(names)
                    names.append(f"{c}[{k}]")
        return index, names

    def n_params(self, n_arms: int) -> int:
        return len(self.shared) + n_arms * (len(self.components) - len(self.shared))


FORMS: dict[str, Form] = {
    "per_arm": Form("per_arm", "C", ()),
    "shared_e": Form("shared_e", "C", ("E",)),
    "shared_e_alpha": Form("shared_e_alpha", "C", ("E", "alpha")),
    "nd_per_arm": Form("nd_per_arm", "ND", ()),
    "nd_shared_e": Form("nd_shared_e", "ND", ("E",)),
    "nd_shared_exponents": Form("nd_shared_exponents", "ND", ("E", "alpha_n", "beta_d")),
}
assert tuple(FORMS) == FIT_FORMS[1:]  # ladder.fit's allowed values (lm_ablate/validation.py), auto first


# --- the loss curves ------------------------------------------------------------------------------------
def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """Huber_δ(r) = r²/2 for |r| ≤ δ, else δ(|r| − δ/2) (scipy's ``loss="huber"`` with ``f_scale=δ``)."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def log_loss(kind: str, phi: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log L̂ (P, n), ∂ log L̂ / ∂φ (P, n, components)) for per-point parameters φ (P, n, components) at
    centred inputs x: (n,) log(C/C_ref) for "C"; (2, n) log(N/N_ref), log(D/D_ref) for "ND"."""
    E = phi[..., 0]
    with np.errstate(divide="ignore"):
        log_e = np.log(E)
    if kind == "C":
        power = phi[..., 1] - phi[..., 2] * x
        m = np.logaddexp(log_e, power)
        p = np.exp(power - m)
        return m, np.stack([np.exp(-m), p, -x * p], axis=-1)
    u, v = x
    t1 = phi[..., 1] - phi[..., 2] * u
    t2 = phi[..., 3] - phi[..., 4] * v
    m = np.logaddexp(log_e, np.logaddexp(t1, t2))
    p1, p2 = np.exp(t1 - m), np.exp(t2 - m)
    return m, np.stack([np.exp(-m), p1, -u * p1, p2, -v * p2], axis=-1)


def lm_huber(
    model: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    y: np.ndarray,
    weights: np.ndarray,
    starts: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    delta: float = HUBER_DELTA,
    max_iter: int = MAX_ITER,
    ftol: float = FTOL,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise Σ_i w_i·Huber_δ(m_i(θ) − y_i) over θ in the box [lo, hi] for P problems at once (rows of
    ``weights`` (P, n), ``starts`` (P, p); ``y`` (n,) or (P, n)); ``model(θ (P, p))`` returns (m (P, n),
    Jacobian (P, n, p)). Returns (θ (P, p), objective (P,), converged (P,)); a problem whose objective is not
    finite is NaN.

    Levenberg–Marquardt on the iteratively reweighted least-squares model of the Huber loss (weights
    w_i·min(1, δ/|r_i|): its gradient is the Huber gradient), the step projected onto the box and kept only
    if it lowers the Huber objective itself. A problem stops when an accepted step lowers the objective by less
    than FTOL relative (converged), when the damping passes 1e10 (no step helps: converged at a bound or a
    stationary point), or at ``max_iter`` (not converged). Only the problems still running are computed.
    """
    theta = np.clip(np.asarray(starts, dtype=float), lo, hi)
    w_all = np.asarray(weights, dtype=float)
    y_all = np.broadcast_to(np.asarray(y, dtype=float), w_all.shape)
    n_p = theta.shape[1]
    m, J = model(theta)
    r = m - y_all
    f = (w_all * huber(r, delta)).sum(axis=1)
    lam = np.full(len(theta), 1e-3)
    converged = np.zeros(len(theta), dtype=bool)
    active = np.flatnonzero(np.isfinite(f))
    eye = np.eye(n_p)
    for _ in range(max_iter):
        if not len(active):
            break
        th, ra, Ja, fa, la, w = theta[active], r[active], J[active], f[active], lam[active], w_all[active]
        omega = w * np.minimum(1.0, delta / np.maximum(np.abs(ra), 1e-300))
        Jw = np.swapaxes(Ja, 1, 2) * omega[:, None, :]  # (P, p, n)
        g = np.matmul(Jw, ra[:, :, None])[:, :, 0]
        H = np.matmul(Jw, Ja)
        diag = np.diagonal(H, axis1=1, axis2=2)
        damp = la[:, None] * (diag + 1e-12 * (diag.sum(axis=1, keepdims=True) + 1e-30))
        step = -solve(H + damp[:, :, None] * eye, g)
        new = np.clip(th + step, lo, hi)
        m_new, J_new = model(new)
        r_new = m_new - y_all[active]
        f_new = (w * huber(r_new, delta)).sum(axis=1)
        better = f_new < fa
        theta[active] = np.where(better[:, None], new, th)
        r[active] = np.where(better[:, None], r_new, ra)
        J[active] = np.where(better[:, None, None], J_new, Ja)
        f[active] = np.where(better, f_new, fa)
        lam[active] = np.where(better, np.maximum(la / 3, 1e-12), la * 4)
        done = (better & (fa - f_new <= ftol * fa)) | (lam[active] > 1e10)
        converged[active[done]] = True
        active = active[~done]
    bad = ~np.isfinite(f)
    theta[bad], f[bad] = np.nan, np.nan
    return theta, f, converged


def solve(H: np.ndarray, g: np.ndarray) -> np.ndarray:
    """H⁻¹g for a stack of small systems; the pseudo-inverse if one of them is singular."""
    try:
        return np.linalg.solve(H, g[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        return np.einsum("pkl,pl->pk", np.linalg.pinv(H), g)


# --- the points and one form's fit ----------------------------------------------------------------------
@dataclass
class Points:
    """Every fitted run of every arm: one point each (a seed is a point, as in Hoffmann et al.)."""

    arm: np.ndarray  # int: the arm's index (0 = baseline)
    rung: np.ndarray  # int
    budget: np.ndarray  # float: the budget's multiple of tokens_per_param x N (1 without ladder.budgets)
    compute: np.ndarray
    params: np.ndarray  # N (ladder.params)
    tokens: np.ndarray  # D
    loss: np.ndarray

    def __len__(self) -> int:
        return len(self.loss)

    def take(self, mask: np.ndarray) -> Points:
        return Points(
            *(getattr(self, f)[mask] for f in ("arm", "rung", "budget", "compute", "params", "tokens", "loss"))
        )

    def with_loss(self, loss: np.ndarray) -> Points:
        return Points(self.arm, self.rung, self.budget, self.compute, self.params, self.tokens, loss)

    def cells(self) -> list[tuple[int, int, float]]:
        """(arm, rung, budget) of every cell, in order."""
        return sorted({(int(a), int(r), float(b)) for a, r, b in zip(self.arm, self.rung, self.budget)})

    def refs(self) -> tuple[float, float, float]:
        g = lambda v: float(np.exp(np.mean(np.log(v))))
        return g(self.compute), g(self.params), g(self.tokens)


@dataclass
class Problem:
    """One form on one set of points: the model of :func:`lm_huber`, its box and its starting grid."""

    form: Form
    points: Points
    n_arms: int
    refs: tuple[float, float, float]

    def __post_init__(self) -> None:
        self.index, self.names = self.form.layout(self.n_arms)
        pts = self.points
        c_ref, n_ref, d_ref = self.refs
        if self.form.kind == "C":
            self.x = np.log(pts.compute / c_ref)
        else:
            self.x = np.stack([np.log(pts.params / n_ref), np.log(pts.tokens / d_ref)])
        self.point_index = self.index[pts.arm]  # (n, components): θ's column of each point's parameter

    def __call__(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        phi = theta[:, self.point_index]  # (P, n, components)
        m, dphi = log_loss(self.form.kind, phi, self.x)
        J = np.zeros((len(theta), len(self.point_index), len(self.names)))
        rows = np.arange(len(self.point_index))
        for j in range(self.point_index.shape[1]):  # a point's components sit in distinct columns of θ
            J[:, rows, self.point_index[:, j]] = dphi[:, :, j]
        return m, J

    def box(self, loss: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        top = float(np.max(self.points.loss if loss is None else loss))
        lo, hi = [], []
        for name in self.names:
            c = name.split("[")[0]
            if c == "E":
                lo.append(0.0), hi.append(top)
            elif c in AMPLITUDES:
                lo.append(math.log(A_RANGE[0] * top)), hi.append(math.log(A_RANGE[1] * top))
            else:
                lo.append(ALPHA_BOUNDS[0]), hi.append(ALPHA_BOUNDS[1])
        return np.array(lo), np.array(hi)

    def starts(self, loss: np.ndarray | None = None) -> np.ndarray:
        """(R, starts, p): a grid over E and the exponents (E slowest), each arm's amplitudes set from its points
        (medians), for each row of ``loss`` (R, n) (or the one loss vector (n,): R = 1)."""
        loss = np.atleast_2d(self.points.loss if loss is None else loss)
        low = loss.min(axis=1)  # (R,)
        grid = [(a,) for a in START_ALPHA] if self.form.kind == "C" else list(START_EXPONENTS)
        comps = self.form.components
        out = np.zeros((len(loss), len(START_E) * len(grid), len(self.names)))
        col = 0
        for e in START_E:
            E = e * low
            excess = np.log(np.maximum(loss - E[:, None], 1e-3 * low[:, None]))  # (R, n)
            for exps in grid:
                fixed = {"E": E, **dict(zip(["alpha"] if self.form.kind == "C" else ["alpha_n", "beta_d"], exps))}
                for j, c in enumerate(comps):
                    for k in range(self.n_arms):
                        mine = self.points.arm == k
                        if c in fixed:
                            value = np.broadcast_to(fixed[c], (len(loss),))
                        elif not mine.any():
                            value = np.median(excess, axis=1)
                        elif self.form.kind == "C":  # a: log A' from L − E = A'·x^−α
                            value = np.median(excess[:, mine] + exps[0] * self.x[mine], axis=1)
                        else:  # a or b: each term half the excess
                            x = self.x[0 if c == "a" else 1][mine]
                            value = np.median(excess[:, mine] - math.log(2) + exps[0 if c == "a" else 1] * x, axis=1)
                        out[:, col, self.index[k, j]] = value
                col += 1
        return out

    def fit(self, weights: np.ndarray, loss: np.ndarray | None = None, extra: np.ndarray | None = None,
            delta: float = HUBER_DELTA) -> Fit:  # fmt: skip
        """Best of the starting grid for each weight row (R, n). ``loss``: (n,), or (R, n) one per row (a
        simulation of many studies). ``extra`` (p,) or (R, p): the bootstrap's start, the point fit. A resample
        lies near the data, so each starts from the point fit alone (BOOT_FTOL); the first BOOT_CHECKED also start
        from the grid's four corners, and ``Fit.start_misses`` counts those where a corner did better (on the
        synthetic ladders of the tests: none, and the same percentiles as five starts for every resample)."""
        R = len(weights)
        loss_rows = self.points.loss if loss is None else np.asarray(loss, dtype=float)
        y = np.log(loss_rows)
        lo, hi = self.box(loss_rows)
        grid = self.starts(loss_rows)  # (1 or R, S, p)
        if extra is None:
            return self._best(weights, y, np.broadcast_to(grid, (R, *grid.shape[1:])), lo, hi, delta, FTOL)
        extra = np.broadcast_to(np.asarray(extra, dtype=float), (R, len(self.names)))
        per = len(START_ALPHA) if self.form.kind == "C" else len(START_EXPONENTS)
        corners = np.broadcast_to(grid[:, [i * per + j for i in (0, len(START_E) - 1) for j in (0, per - 1)]],
                                  (R, 4, len(self.names)))  # fmt: skip
        first = np.where(np.isfinite(extra), extra, corners[:, 0])[:, None, :]  # a failed point fit: a corner
        checked = np.arange(R) < BOOT_CHECKED
        rows = lambda a, m: a[m] if np.ndim(a) == 2 and len(a) == R else a
        out = self._best(weights[~checked], rows(y, ~checked), first[~checked], lo, hi, delta, BOOT_FTOL)
        many = self._best(weights[checked], rows(y, checked), np.concatenate([first, corners], axis=1)[checked],
                          lo, hi, delta, BOOT_FTOL)  # fmt: skip
        merged = Fit(*(np.concatenate([a, b]) for a, b in zip(
            (many.theta, many.objective, many.converged, many.agreeing),
            (out.theta, out.objective, out.converged, out.agreeing))), lo, hi, self.names)  # fmt: skip
        merged.start_misses = int((many.best_start > 0).sum())
        return merged

    def _best(self, weights: np.ndarray, y: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              delta: float, ftol: float) -> Fit:  # fmt: skip
        R, S = starts.shape[:2]
        if R == 0:
            empty = np.zeros((0, len(self.names)))
            return Fit(empty, np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=int), lo, hi, self.names)
        y = np.repeat(y, S, axis=0) if y.ndim == 2 else y
        theta, f, conv = lm_huber(self, y, np.repeat(weights, S, axis=0), starts.reshape(R * S, -1), lo, hi, delta,
                                  ftol=ftol)  # fmt: skip
        theta, f, conv = theta.reshape(R, S, -1), f.reshape(R, S), conv.reshape(R, S)
        safe = np.where(np.isfinite(f), f, np.inf)
        best = np.argmin(safe, axis=1)
        rows = np.arange(R)
        fbest = safe[rows, best]
        agree = (safe <= fbest[:, None] * (1 + AGREE) + 1e-300).sum(axis=1)
        # the first start counts as best when it is within AGREE of the best (a corner tying it is no miss)
        first_ok = safe[:, 0] <= fbest * (1 + AGREE) + 1e-300
        fit = Fit(theta[rows, best], f[rows, best], conv[rows, best], agree, lo, hi, self.names)
        fit.best_start = np.where(first_ok, 0, best)
        return fit


@dataclass
class Fit:
    theta: np.ndarray  # (B, p), centred units
    objective: np.ndarray  # (B,)
    converged: np.ndarray  # (B,) bool
    agreeing: np.ndarray  # (B,) int: starts that reached the best objective
    lo: np.ndarray
    hi: np.ndarray
    names: list[str]
    start_misses: int = 0  # checked bootstrap resamples where a grid corner beat the point fit's start
    best_start: np.ndarray | None = None


def fit_form(form: Form, points: Points, n_arms: int, weights: np.ndarray, refs: tuple[float, float, float],
             loss: np.ndarray | None = None, extra: np.ndarray | None = None,
             delta: float = HUBER_DELTA) -> Fit:  # fmt: skip
    """One form fitted to ``points`` for each row of ``weights``; a form with nothing shared, arm by arm."""
    if not form.separable:
        return Problem(form, points, n_arms, refs).fit(weights, loss, extra, delta)
    index, names = form.layout(n_arms)
    B, p = len(weights), len(names)
    theta, lo, hi = np.full((B, p), np.nan), np.zeros(p), np.zeros(p)
    obj, conv, agree, misses = np.zeros(B), np.ones(B, dtype=bool), np.full(B, 10**6), 0
    loss = points.loss if loss is None else np.asarray(loss, dtype=float)
    for k in range(n_arms):
        mine = points.arm == k
        if not mine.any():
            continue
        sub = points.take(mine)
        sub.arm = np.zeros(int(mine.sum()), dtype=int)
        one = Problem(form, sub, 1, refs).fit(weights[:, mine], loss[..., mine],
                                               None if extra is None else extra[..., index[k]], delta)  # fmt: skip
        theta[:, index[k]] = one.theta
        lo[index[k]], hi[index[k]] = one.lo, one.hi
        obj += one.objective
        conv &= one.converged
        agree = np.minimum(agree, one.agreeing)
        misses += one.start_misses
    return Fit(theta, obj, conv, agree, lo, hi, names, misses)


# --- from a fit to each arm's curve ---------------------------------------------------------------------
def per_arm_params(form: Form, theta: np.ndarray, n_arms: int) -> np.ndarray:
    """(..., n_arms, components) per-arm parameters (centred units) from θ (..., p)."""
    index, _ = form.layout(n_arms)
    return theta[..., index]


def raw_c(phi: np.ndarray, c_ref: float) -> np.ndarray:
    """L(C) parameters in raw units: (E, log A, α) with A = A'·C_ref^α."""
    out = phi.copy()
    out[..., 1] = phi[..., 1] + phi[..., 2] * math.log(c_ref)
    return out


def raw_nd(phi: np.ndarray, n_ref: float, d_ref: float) -> np.ndarray:
    """L(N, D) parameters in raw units: (E, log A, a, log B, b), L = E + A·N^(−a) + B·D^(−b)."""
    out = phi.copy()
    out[..., 1] = phi[..., 1] + phi[..., 2] * math.log(n_ref)
    out[..., 3] = phi[..., 3] + phi[..., 4] * math.log(d_ref)
    return out


def frontier(nd: np.ndarray, c0: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The compute-optimal frontier of L(N, D) (raw (..., 5)) with FLOPs per token f(N) = e^c0·N^s: its power
    law in C (..., 3) = (E, log G, γ), and (..., 2) = (κ, λ) with log N_opt(C) = κ + λ·log C."""
    E, la, a, lb, b = (nd[..., i] for i in range(5))
    bs = b * s
    A1 = la  # log T1 = A1 − a·log N
    B1 = lb + b * c0  # log T2 = B1 − b·log C + b·s·log N
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = a * b / (a + bs)
        log_ratio = np.log(a / bs)
        log_g = (bs * A1 + a * B1 - a * log_ratio) / (a + bs) + np.log1p(a / bs)
        kappa = (log_ratio + A1 - B1) / (a + bs)
        lam = b / (a + bs)
    return np.stack([E, log_g, gamma], axis=-1), np.stack([kappa, lam], axis=-1)


# --- the frontier within the trained allocations ---------------------------------------------------------
ND_CURVE = ("E", "log_A", "a", "log_B", "b", "c0", "s", "log_r_lo", "log_r_hi")  # an L(N, D) arm's curve in C
BISECT = 80  # halvings of the log-compute bracket when inverting a curve (250 / 2^80: float precision)
LOG_C_BRACKET = (0.0, 250.0)  # log C searched for the compute that reaches a loss (1 to e^250 FLOPs)


def allocation_curve(nd: np.ndarray, c0: np.ndarray, s: np.ndarray, log_r: np.ndarray) -> np.ndarray:
    """An arm's curve in compute (..., 9) = ND_CURVE: its L(N, D) (raw (..., 5)), its FLOPs per token
    f(N) = e^c0·N^s, and the band of tokens per parameter log(D/N) in [log_r (..., 0), log_r (..., 1)] its
    fitted cells trained (:func:`allocation`)."""
    shape = nd.shape[:-1]
    extra = [np.broadcast_to(np.asarray(v, dtype=float), shape) for v in (c0, s, log_r[..., 0], log_r[..., 1])]
    return np.concatenate([nd, np.stack(extra, axis=-1)], axis=-1)


def allocation(curve: np.ndarray, log_c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log N, log D) of the best allocation of compute C within the trained tokens per parameter.

    At fixed C, D = C/f(N), so L = E + A·N^(−a) + B·e^(b·c0)·C^(−b)·N^(b·s): a sum of two exponentials in log N,
    convex; its minimum under r_lo ≤ D/N ≤ r_hi is the unconstrained optimum (:func:`frontier`) clipped to the
    band's ends, log N = (log C − c0 − log r)/(1 + s). Where the unconstrained optimum lies inside the band this
    is the compute-optimal frontier; outside it, the frontier would rest on allocations no run trained (a size
    exponent at its bound puts it at a few parameters), and the curve follows the band's edge instead."""
    c0, s, r_lo, r_hi = (curve[..., i] for i in range(5, 9))
    _, n_opt = frontier(curve[..., :5], c0, s)
    with np.errstate(invalid="ignore"):
        log_n = np.clip(n_opt[..., 0] + n_opt[..., 1] * log_c, (log_c - c0 - r_hi) / (1 + s),
                        (log_c - c0 - r_lo) / (1 + s))  # fmt: skip
    return log_n, log_c - c0 - s * log_n


def allocation_loss(curve: np.ndarray, log_c: Any) -> np.ndarray:
    """L at the best allocation within the trained band (:func:`allocation`) of compute e^log_c."""
    log_c = np.asarray(log_c, dtype=float)
    log_n, log_d = allocation(curve, log_c)
    return curve[..., 0] + np.exp(curve[..., 1] - curve[..., 2] * log_n) + np.exp(curve[..., 3] - curve[..., 4] * log_d)


def allocation_log_compute(curve: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """log C at which :func:`allocation_loss` reaches ``loss`` (it falls strictly with C: at a larger C the same
    tokens per parameter buys a larger N and D): bisection in LOG_C_BRACKET; +inf where loss ≤ E (never
    reached), the bracket's end where the loss lies beyond it."""
    lo = np.full(np.broadcast_shapes(curve.shape[:-1], np.shape(loss)), LOG_C_BRACKET[0])
    hi = np.full_like(lo, LOG_C_BRACKET[1])
    for _ in range(BISECT):
        mid = 0.5 * (lo + hi)
        above = allocation_loss(curve, mid) > loss  # not there yet: more compute
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(loss > curve[..., 0], 0.5 * (lo + hi), np.inf)


def allocation_log_multiplier(x: np.ndarray, base: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """log CM(C) = log L_base⁻¹(L_X(C)) − log C between two allocation curves (..., 9); +inf where L_X(C) ≤
    E_base."""
    return allocation_log_compute(base, allocation_loss(x, log_c)) - log_c


def flops_law(params: np.ndarray, flops_per_token: np.ndarray) -> tuple[float, float]:
    """(c0, s) of log f = c0 + s·log N through an arm's rungs (least squares; s = 1 from one rung)."""
    u, v = np.log(params), np.log(flops_per_token)
    if len(np.unique(u)) < 2:
        return float(np.mean(v - u)), 1.0
    s, c0 = np.polyfit(u, v, 1)
    return float(c0), float(s)


def curve_loss(law: np.ndarray, compute: Any) -> np.ndarray:
    """An arm's loss at ``compute`` on its curve: E + exp(log A − α log C) for power laws (..., 3), the best
    allocation within the trained band for L(N, D) curves (..., 9)."""
    c = np.log(np.asarray(compute, dtype=float))
    if law.shape[-1] == len(ND_CURVE):
        return allocation_loss(law, c)
    return law[..., 0] + np.exp(law[..., 1] - law[..., 2] * c)


def predict(form: Form, phi_raw: np.ndarray, arm: np.ndarray, compute: np.ndarray, params: np.ndarray,
            tokens: np.ndarray) -> np.ndarray:  # fmt: skip
    """Each point's predicted loss under a fit's raw per-arm parameters (n_arms, components)."""
    p = phi_raw[arm]
    if form.kind == "C":
        return p[:, 0] + np.exp(p[:, 1] - p[:, 2] * np.log(compute))
    return p[:, 0] + np.exp(p[:, 1] - p[:, 2] * np.log(params)) + np.exp(p[:, 3] - p[:, 4] * np.log(tokens))


# --- every form: fits, intervals, held-out checks -------------------------------------------------------
W_FORM_FEW_POINTS = "few_points"  # fewer cells than parameters
W_FORM_ONE_BUDGET = "one_budget"  # an L(N, D) form without several budgets per rung
W_FORM_OTHER_DATA = "other_data"  # a shared form across arms trained on different data or tokenizers
W_FORM_NO_ARMS = "one_arm"  # a shared form with one arm is the per-arm form


class Prediction:
    """Errors of a held-out ``predicted`` loss against the ``observed`` one (fields of the dataclass using it)."""

    observed: float
    predicted: float

    @property
    def rel_error(self) -> float:
        return abs(self.predicted - self.observed) / self.observed

    @property
    def signed_error(self) -> float:
        return (self.predicted - self.observed) / self.observed


@dataclass
class CellCheck(Prediction):
    """A held-out cell: the mean loss of its runs against the prediction of the fit made without it."""

    arm: int
    rung: int
    budget: float
    compute: float
    observed: float
    predicted: float


@dataclass
class FormFit:
    form: Form
    n_arms: int
    n_cells: int
    n_params: int
    why_not: str | None = None  # W_FORM_* when the form is not fitted here
    names: list[str] = field(default_factory=list)
    theta: np.ndarray | None = None  # (p,) centred units
    boot: np.ndarray | None = None  # (B, p)
    objective: float = math.nan
    converged: bool = False
    agreeing_starts: int = 0
    at_bound: list[str] = field(default_factory=list)  # θ names on a bound of the box
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # θ name -> percentile interval
    raw: np.ndarray | None = None  # (n_arms, components) raw units
    raw_boot: np.ndarray | None = None  # (B, n_arms, components)
    # each arm's curve in compute: L(C) forms (n_arms, 3), the fit; L(N, D) forms (n_arms, 9), the best allocation
    # within the trained tokens per parameter (ND_CURVE, :func:`allocation`)
    laws: np.ndarray | None = None
    laws_boot: np.ndarray | None = None  # (B, n_arms, 3 or 9)
    frontier_laws: np.ndarray | None = None  # (n_arms, 3): L(C) forms the fit; L(N, D) the unconstrained frontier
    n_opt: np.ndarray | None = None  # (n_arms, 2): log N_opt = κ + λ log C (L(N, D) forms, unconstrained)
    bands: np.ndarray | None = None  # (n_arms, 2): log(D/N) of each arm's fitted cells, lowest and highest
    flops: list[tuple[float, float]] = field(default_factory=list)  # per arm (c0, s) of f(N)
    held_out: list[CellCheck] = field(default_factory=list)  # the largest rung of every arm, left out
    held_out_factor: float = math.nan  # compute of the held-out rung / largest compute of the rest (min over arms)
    lobo: list[CellCheck] = field(default_factory=list)  # each budget left out in turn
    residuals: list[CellCheck] = field(default_factory=list)  # every cell against the full fit
    refs: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    start_misses: int = 0  # checked bootstrap resamples where a grid corner beat the point fit's start

    @property
    def fitted(self) -> bool:
        return self.theta is not None and bool(np.isfinite(self.theta).all())

    def held_out_error(self, arm: int) -> float:
        """Worst relative error over the arm's held-out-rung cells (NaN: no check)."""
        errs = [c.rel_error for c in self.held_out if c.arm == arm]
        return max(errs) if errs else math.nan

    def lobo_error(self, arm: int) -> float:
        errs = [c.rel_error for c in self.lobo if c.arm == arm]
        return max(errs) if errs else math.nan

    @property
    def score(self) -> float:
        """The held-out error model choice reads: the worst over arms of the largest-rung check and the
        leave-one-budget-out check (NaN without a largest-rung check)."""
        rung = [self.held_out_error(k) for k in range(self.n_arms)]
        if not rung or not all(math.isfinite(e) for e in rung):
            return math.nan
        budget = [e for e in (self.lobo_error(k) for k in range(self.n_arms)) if math.isfinite(e)]
        return max(rung + budget)


def percentile(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval, no interpolation (+inf resamples give +inf, never NaN); NaN values dropped."""
    v = values[~np.isnan(values)]
    if not len(v):
        return math.nan, math.nan
    q = (1 - confidence) / 2
    low, high = np.quantile(v, [q, 1 - q], method="inverted_cdf")
    return float(low), float(high)


def cell_means(points: Points) -> list[tuple[tuple[int, int, float], float, float, float, float]]:
    """((arm, rung, budget), mean loss, median compute, median N, median D) per cell."""
    out = []
    for cell in points.cells():
        mask = (points.arm == cell[0]) & (points.rung == cell[1]) & (points.budget == cell[2])
        out.append((cell, float(np.mean(points.loss[mask])), float(np.median(points.compute[mask])),
                    float(np.median(points.params[mask])), float(np.median(points.tokens[mask]))))  # fmt: skip
    return out


def fit_forms(points: Points, spread: np.ndarray, weights: np.ndarray, n_arms: int, same_data: bool,
              flops: list[tuple[float, float]], confidence: float, delta: float = HUBER_DELTA,
              names: tuple[str, ...] = tuple(FORMS)) -> dict[str, FormFit]:  # fmt: skip
    """Every form in ``names`` fitted to ``points`` (all arms), bootstrapped with ``weights`` (B, n) over
    ``spread`` (the modified-residual losses), with its held-out checks. ``flops``: each arm's f(N) law."""
    refs = points.refs()
    several_budgets = any(
        len({b for (a, r, b) in points.cells() if a == arm and r == rung}) > 1
        for arm, rung, _ in points.cells()
    )  # fmt: skip
    n_cells = len(points.cells())
    out: dict[str, FormFit] = {}
    for name in names:
        form = FORMS[name]
        ff = FormFit(form, n_arms, n_cells, form.n_params(n_arms), refs=refs, flops=flops)
        out[name] = ff
        if form.kind == "ND" and not several_budgets:
            ff.why_not = W_FORM_ONE_BUDGET
        elif form.shared and not same_data:
            ff.why_not = W_FORM_OTHER_DATA
        elif form.shared and n_arms < 2:
            ff.why_not = W_FORM_NO_ARMS
        elif n_cells < ff.n_params or any(
            len({r for (a, r, b) in points.cells() if a == k}) < MIN_RUNGS
            or len({(r, b) for (a, r, b) in points.cells() if a == k}) < len(form.components) - len(form.shared)
            for k in range(n_arms)
        ):  # fmt: skip
            ff.why_not = W_FORM_FEW_POINTS
        if ff.why_not is None:
            fill(ff, points, spread, weights, confidence, delta)
    return out


def fill(ff: FormFit, points: Points, spread: np.ndarray, weights: np.ndarray, confidence: float,
         delta: float) -> None:  # fmt: skip
    form, K, refs = ff.form, ff.n_arms, ff.refs
    point = fit_form(form, points, K, np.ones((1, len(points))), refs, delta=delta)
    ff.names = point.names
    ff.theta, ff.objective = point.theta[0], float(point.objective[0])
    ff.converged, ff.agreeing_starts = bool(point.converged[0]), int(point.agreeing[0])
    if not ff.fitted:
        ff.theta = None
        return
    ff.at_bound = [n for n, v, lo, hi in zip(point.names, ff.theta, point.lo, point.hi)
                   if np.isclose(v, lo, rtol=1e-6, atol=1e-9) or np.isclose(v, hi, rtol=1e-6, atol=1e-9)]  # fmt: skip
    boot_fit = fit_form(form, points, K, weights, refs, loss=spread, extra=ff.theta, delta=delta)
    boot = ff.boot = boot_fit.theta
    for j, name in enumerate(point.names):
        ff.intervals[name] = percentile(boot[:, j], confidence)
    ff.raw, ff.raw_boot = to_raw(form, ff.theta, K, refs), to_raw(form, boot, K, refs)
    ff.bands = bands_of(points, K) if form.kind == "ND" else None
    ff.laws, ff.laws_boot = laws_of(form, ff.raw, ff.flops, ff.bands), laws_of(form, ff.raw_boot, ff.flops, ff.bands)
    ff.frontier_laws, ff.n_opt = ff.raw, None
    if form.kind == "ND":
        c0 = np.array([c for c, _ in ff.flops])
        s = np.array([s for _, s in ff.flops])
        ff.frontier_laws, ff.n_opt = frontier(ff.raw, c0, s)
    means = cell_means(points)
    arm_idx = np.array([c[0][0] for c in means])
    pred = predict(form, ff.raw, arm_idx, *(np.array([c[i] for c in means]) for i in (2, 3, 4)))
    ff.residuals = [CellCheck(c[0][0], c[0][1], c[0][2], c[2], c[1], float(p)) for c, p in zip(means, pred)]
    ff.held_out, ff.held_out_factor = held_out(form, points, K, refs, delta, largest_rung, ff.theta)
    ff.lobo, _ = held_out(form, points, K, refs, delta, each_budget, ff.theta)
    ff.start_misses = boot_fit.start_misses


def to_raw(form: Form, theta: np.ndarray, n_arms: int, refs: tuple[float, float, float]) -> np.ndarray:
    phi = per_arm_params(form, theta, n_arms)
    return raw_c(phi, refs[0]) if form.kind == "C" else raw_nd(phi, refs[1], refs[2])


def laws_of(form: Form, raw: np.ndarray, flops: list[tuple[float, float]], bands: np.ndarray | None) -> np.ndarray:
    """Each arm's curve in compute: the L(C) fit itself, or the L(N, D) fit's allocation curve (ND_CURVE) over the
    arm's f(N) law and its band of trained tokens per parameter (n_arms, 2)."""
    if form.kind == "C":
        return raw
    assert bands is not None
    c0 = np.array([c for c, _ in flops])
    s = np.array([s for _, s in flops])
    return allocation_curve(raw, c0, s, bands)


def bands_of(points: Points, n_arms: int) -> np.ndarray:
    """(n_arms, 2): the lowest and highest log(D/N) among each arm's points (NaN for an arm without points)."""
    ratio = np.log(points.tokens / points.params)
    out = np.full((n_arms, 2), np.nan)
    for k in range(n_arms):
        mine = ratio[points.arm == k]
        if len(mine):
            out[k] = mine.min(), mine.max()
    return out


def largest_rung(points: Points) -> list[np.ndarray]:
    """One split: every arm's largest rung (all its budgets) left out."""
    top = {k: points.rung[points.arm == k].max() for k in np.unique(points.arm)}
    return [np.array([r == top[a] for a, r in zip(points.arm, points.rung)])]


def each_budget(points: Points) -> list[np.ndarray]:
    """One split per budget, when there are three or more (two left to fit the data axis)."""
    budgets = np.unique(points.budget)
    return [points.budget == b for b in budgets] if len(budgets) >= 3 else []


def held_out(form: Form, points: Points, n_arms: int, refs: tuple[float, float, float], delta: float,
             splits: Callable[[Points], list[np.ndarray]],
             start: np.ndarray | None = None) -> tuple[list[CellCheck], float]:  # fmt: skip
    """Refit without each split's points, predict their cells' mean losses; and how far the first split
    extrapolated in compute (its largest compute / the largest compute of the rest, the smallest over arms)."""
    out: list[CellCheck] = []
    factor = math.nan
    for i, left in enumerate(splits(points)):
        rest = points.take(~left)
        if len(rest.cells()) < form.n_params(n_arms) or any(
            len({(r, b) for (a, r, b) in rest.cells() if a == k}) < len(form.components) - len(form.shared)
            for k in range(n_arms)
        ):  # fmt: skip
            continue
        # from the full fit and the grid's corners (the full fit lies near the optimum without a few cells)
        fit = fit_form(form, rest, n_arms, np.ones((1, len(rest))), refs, extra=start, delta=delta)
        if not np.isfinite(fit.theta[0]).all():
            continue
        raw = to_raw(form, fit.theta[0], n_arms, refs)
        means = cell_means(points.take(left))
        arm_idx = np.array([c[0][0] for c in means])
        pred = predict(form, raw, arm_idx, *(np.array([c[i] for c in means]) for i in (2, 3, 4)))
        out += [CellCheck(c[0][0], c[0][1], c[0][2], c[2], c[1], float(p)) for c, p in zip(means, pred)]
        if i == 0:
            factors = []
            for k in range(n_arms):
                mine_left, mine_rest = points.compute[left & (points.arm == k)], rest.compute[rest.arm == k]
                if len(mine_left) and len(mine_rest):
                    factors.append(float(mine_left.max() / mine_rest.max()))
            factor = min(factors) if factors else math.nan
    return out, factor


def default_form(forms: dict[str, FormFit]) -> str:
    """The form a study's claims use unless its held-out check fails: shared E where the arms share data and
    tokenizer (one entropy floor), else each arm its own; L(N, D) where the rungs have several budgets."""
    nd = forms.get("nd_shared_e")
    several = nd is not None and nd.why_not != W_FORM_ONE_BUDGET
    shared = forms.get("shared_e")
    same = shared is not None and shared.why_not not in (W_FORM_OTHER_DATA, W_FORM_NO_ARMS)
    return ("nd_" if several else "") + ("shared_e" if same else "per_arm")


def choose(forms: dict[str, FormFit], requested: str, goal: float) -> tuple[str | None, str]:
    """(the form the claims use, how it was chosen: "requested" | "default" | "held_out").

    ``ladder.fit=auto``: the default form (:func:`default_form`), unless its held-out score is above ``goal``
    while another fitted form's is within it: then the form with the smallest score (ties: fewer parameters).
    Choosing among forms by the noise of one held-out rung would bias the chosen form's intervals (on
    synthetic ladders whose every form is right it took the coverage of the multiplier's interval below its
    level), so the default stands unless the data reject it. A default that cannot be fitted falls back to
    the first fitted form (shared before per-arm); None when nothing could be fitted."""
    if requested != "auto":
        return requested, "requested"
    name = default_form(forms)
    default = forms.get(name)
    fitted = [f for f in forms.values() if f.fitted]
    if default is None or not default.fitted:
        order = [n for n in ("nd_shared_e", "shared_e", "nd_per_arm", "per_arm") if n in forms and forms[n].fitted]
        return (order[0], "default") if order else ((fitted[0].form.name, "default") if fitted else (None, "default"))
    if math.isfinite(default.score) and default.score > goal:
        better = [f for f in fitted if math.isfinite(f.score) and f.score <= goal]
        if better:
            order = list(FORMS)
            return min(better, key=lambda f: (f.score, f.n_params, order.index(f.form.name))).form.name, "held_out"
    return name, "default"
