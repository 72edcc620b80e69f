"""Iso-parameter shapes (group ``shape``): a model asked for by its ratios at a target parameter count, so that a
study of d_ff / d_model, heads or depth holds N fixed while the shape changes (Kaplan et al. 2020, Fig. 5).
``shape=iso`` solves model.d_model (d), n_layers (L), n_heads (H), head_dim (h) and activation.d_ff (F) to integers:

    N(d, L, H, h, F) = shape.target_params within shape.tolerance (2%)   N: non-embedding parameters, as the run
                                                                          counts them (lm_ablate.model.model_cost)
    H h = attn_ratio x d                        Kaplan's d_attn / d_model, 1 by default
    h = shape.head_dim, or H = shape.n_heads    held exactly; neither: the divisor of H h nearest head_dim_target
    F = ffn_ratio x d                           to the nearest multiple of d_ff_multiple; null: the activation's
                                                own rule (4d ungated, 8d/3 gated: lm_ablate/components/ffn.py)
    and one or two of   L = shape.n_layers,   d = shape.d_model,   d / L = shape.aspect

    pinned             solved     d_ff
    n_layers           d          by ratio         the ffn_ratio study; the aspect study sweeps n_layers
    d_model            L          by ratio
    aspect             d and L    by ratio         L whose d / L is closest to the aspect
    two of them        the third  meets N          heads at fixed d_model and N; attn_ratio != 1 paid by d_ff

Among the integer shapes within tolerance the solver takes the one whose aspect is closest (when one is asked),
then whose head dim is closest to head_dim_target (when none is held), then whose N is closest. When none is
within tolerance it refuses in one line naming the request and the nearest feasible target.

Counting is read off modules built on the meta device (no memory), not off a formula. A block's parameters are
multilinear in (d, F, H, h): each parameter is a product of widths, each linear in one of them (d x h (H + 2 n_kv)
for qkv, d x 2F for a gated FFN's input, h for a per-head QK-norm, d for a norm's gain), so the 16 blocks built at
{1, 2}^4 give its polynomial exactly. The rest (final norm, an untied head and its bias, embedding projections) is
bilinear in d and the vocabulary V, read off whole models built at two widths and V = 1, 2. Every probe is tiny
and built on the CPU (the meta device would import torch._dynamo, seconds, on its first ``normal_``). The run checks
the count against the model it builds (:meth:`Solution.check`; tests/test_shape.py against many configurations).

Where it applies: like a ladder's rung, when the config is composed (:func:`lm_ablate.config.compose`, the sweep
check, the training CLI) and again once the run knows its vocabulary (an untied head counts in N), so validation,
the sweep check, ``python -m lm_ablate.cost`` and the run see the solved model.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from lm_ablate.components.blocks import BLOCKS
from lm_ablate.components.ffn import GatedFFN, hidden_width
from lm_ablate.data import vocabulary
from lm_ablate.errors import ConfigError, bad
from lm_ablate.model import ModelCost, TransformerLM, model_cost
from lm_ablate.registry import ACTIVATIONS
from lm_ablate.schema import SHAPE_SETS
from lm_ablate.validation import SHAPE_REQUEST, check_shape, check_sizes, validate

# shape=iso's values for keys left null (conf/shape/iso.yaml writes them out)
DEFAULTS = {"attn_ratio": 1.0, "head_dim_target": 32, "d_ff_multiple": 1, "tolerance": 0.02}
# what shape=iso sets, and the key that holds it instead
SETS = SHAPE_SETS
CANDIDATE_CHECKS = 500  # candidates checked (size rules) before the nearest one is given up on
FULL_TRIES = 5  # candidates validated and built in full before the first one's error is reported


@dataclass(frozen=True)
class Request:
    """The keys of a ``shape=iso`` node, with shape=iso's defaults for those left null."""

    target: float
    ffn_ratio: float | None
    aspect: float | None
    attn_ratio: float
    head_dim: int | None
    n_heads: int | None
    head_dim_target: int
    d_model: int | None
    n_layers: int | None
    d_ff_multiple: int
    tolerance: float

    @classmethod
    def of(cls, node: Any) -> Request:
        v = {k: node[k] for k in SHAPE_REQUEST}
        v.update({k: d if v[k] is None else v[k] for k, d in DEFAULTS.items()})
        return cls(
            float(v["target_params"]), v["ffn_ratio"], v["aspect"], float(v["attn_ratio"]), v["head_dim"],
            v["n_heads"], int(v["head_dim_target"]), v["d_model"], v["n_layers"], int(v["d_ff_multiple"]),
            float(v["tolerance"]),
        )  # fmt: skip

    @property
    def solves_d_ff(self) -> bool:
        """Width and depth both pinned: d_ff is what meets N."""
        return sum(x is not None for x in (self.d_model, self.n_layers, self.aspect)) == 2

    @property
    def holds_heads(self) -> bool:
        return self.head_dim is not None or self.n_heads is not None

    def text(self) -> str:
        """``shape=iso shape.target_params=400000 shape.n_layers=4 shape.ffn_ratio=32``: the keys given."""
        keys = {"target_params": f"{self.target:g}", "ffn_ratio": self.ffn_ratio, "aspect": self.aspect,
                "attn_ratio": None if self.attn_ratio == 1 else self.attn_ratio, "head_dim": self.head_dim,
                "n_heads": self.n_heads, "d_model": self.d_model, "n_layers": self.n_layers}  # fmt: skip
        return " ".join(["shape=iso"] + [f"shape.{k}={v:g}" if isinstance(v, float) else f"shape.{k}={v}"
                                         for k, v in keys.items() if v is not None])  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """One integer shape and its non-embedding count N; ``aspect_miss`` = |log(aspect of its depth / asked)|."""

    d: int
    L: int
    H: int
    h: int
    F: int
    n: int
    aspect_miss: float = 0.0

    def text(self) -> str:
        return f"d_model={self.d} n_layers={self.L} n_heads={self.H} head_dim={self.h} d_ff={self.F}"


@dataclass(frozen=True)
class Solution:
    """The shape a request solved to; N counted on the whole model built as the run builds it."""

    request: Request
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    d_ff: int
    params_non_embedding: int
    d_ff_default: bool  # d_ff is the activation's own rule (activation.d_ff stays null)

    @property
    def ratios(self) -> dict[str, float]:
        d = self.d_model
        return {"ffn_ratio": self.d_ff / d, "aspect": d / self.n_layers, "attn_ratio": self.n_heads * self.head_dim / d}

    def check(self, cost: ModelCost) -> None:
        """The model as built (``cost``: model_cost of the run's model, or of cost's meta-device one) has the N the
        solver counted; a difference is a bug here (a component whose parameters are not multilinear in the
        sizes), never bad input."""
        if cost.params_non_embedding != self.params_non_embedding:
            raise RuntimeError(f"lm_ablate.shape: the solved shape has {self.params_non_embedding:,} non-embedding "
                               f"parameters by the solver's count but {cost.params_non_embedding:,} as built")  # fmt: skip

    def record(self, cost: ModelCost) -> dict[str, Any]:
        """The run record's ``shape`` entry (summary.json): target, achieved counts, the solved sizes and ratios,
        FLOPs/token. ``cost`` is the run's own count (model_cost)."""
        return {
            "target_params": self.request.target,
            "params_non_embedding": cost.params_non_embedding,
            "params_total": cost.params_total,
            "relative_error": cost.params_non_embedding / self.request.target - 1,
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "head_dim": self.head_dim,
            "d_ff": self.d_ff,
            **self.ratios,
            "flops_per_token": cost.flops_per_token,
        }

    def lines(self, cost: ModelCost) -> list[str]:
        """``python -m lm_ablate.cost``'s lines for the shape."""
        r = self.ratios
        n = cost.params_non_embedding
        return [
            f"shape             {self.request.text()}",
            f"  target N        {self.request.target:,.0f} non-embedding; achieved {n:,} "
            f"({n / self.request.target - 1:+.2%}), total {cost.params_total:,}",
            f"  solved          d_model {self.d_model}, n_layers {self.n_layers}, n_heads {self.n_heads}, "
            f"head_dim {self.head_dim}, d_ff {self.d_ff}",
            f"  ratios          d_ff/d_model {r['ffn_ratio']:.3g}, d_model/n_layers {r['aspect']:.3g}, "
            f"heads x head_dim/d_model {r['attn_ratio']:.3g}",
        ]


class Counter:
    """Non-embedding parameters of ``cfg``'s model at any sizes (d, L, H, h, F) and vocabulary V, exactly (module
    docstring): outer(d, V) + L x block(d, F, H, h). Every probe is a tiny model built on the CPU, with the
    caller's random state restored after (building draws the init)."""

    CORNERS = (1, 2)  # Lagrange basis on {1, 2}: l_1(x) = 2 - x, l_2(x) = x - 1 (integer coefficients)

    def __init__(self, cfg: DictConfig, heads: tuple[int, int]):
        self.plain = OmegaConf.to_object(cfg)  # dataclasses: a block builds in about a millisecond
        with torch.random.fork_rng(devices=[]):
            self.gated = isinstance(ACTIVATIONS.build(self._activation(None), 8), GatedFFN)
            self.terms = self._block_terms()
            self.outer = self._outer(cfg, *heads)

    def _activation(self, d_ff: int | None) -> Any:
        return dataclasses.replace(self.plain.activation, d_ff=d_ff)

    def default_d_ff(self, d: int) -> int:
        """The activation's own width at d_model = d (activation.d_ff null)."""
        return hidden_width(self._activation(None), d, self.gated)

    def block_params(self, d: int, F: int, H: int, h: int) -> int:
        """Parameters of one block built at these sizes."""
        cfg = dataclasses.replace(
            self.plain,
            model=dataclasses.replace(self.plain.model, d_model=d, n_heads=H, head_dim=h),
            activation=self._activation(F),
        )
        block = BLOCKS.get(cfg.model.block)(cfg, 0)
        return sum(p.numel() for p in block.parameters())

    def _block_terms(self) -> list[tuple[tuple[int, ...], int]]:
        """The block's multilinear polynomial in (d, F, H, h): [(indices of the variables of a monomial, its
        integer coefficient)], from the blocks built at the 16 corners of {1, 2}^4."""
        alpha, beta = {1: 2, 2: -1}, {1: -1, 2: 1}  # l_c(x) = alpha[c] + beta[c] x
        coef: dict[tuple[int, ...], int] = {}
        for corner in itertools.product(self.CORNERS, repeat=4):
            value = self.block_params(*corner)
            for subset in itertools.product((False, True), repeat=4):
                c = value * math.prod(beta[at] if taken else alpha[at] for taken, at in zip(subset, corner))
                key = tuple(i for i, taken in enumerate(subset) if taken)
                coef[key] = coef.get(key, 0) + c
        return [(k, c) for k, c in coef.items() if c]

    def block(self, d: float, F: float, H: float, h: float) -> float:
        x = (d, F, H, h)
        return sum(c * math.prod(x[i] for i in k) for k, c in self.terms)

    def _outer(self, cfg: DictConfig, H: int, h: int) -> dict[tuple[int, int], Fraction]:
        """outer(d, V) = sum of c[i, j] d^i V^j (i, j in {0, 1}): the non-embedding parameters outside the blocks
        (final norm, an untied head and its bias, projections), from whole models built with H heads of width h
        (which the config's rules must accept) at two widths and vocabularies 1 and 2 (one when the count does
        not change with the vocabulary: no untied head, no head bias)."""
        d1, d2 = [k * H * h for k in (1, 2, 3) if k * H * h != cfg.model.embed_dim][:2]
        probe = copy.deepcopy(cfg)
        with open_dict(probe):
            probe.model.update(n_heads=H, head_dim=h, n_layers=1)  # one block if the rules allow it (fast)
        try:
            n = {(d1, 1): self._outside(probe, d1, 1)}
        except ConfigError:
            probe.model.n_layers = cfg.model.n_layers
            n = {(d1, 1): self._outside(probe, d1, 1)}
        n[d1, 2] = self._outside(probe, d1, 2)
        n[d2, 1] = self._outside(probe, d2, 1)
        n[d2, 2] = n[d2, 1] if n[d1, 1] == n[d1, 2] else self._outside(probe, d2, 2)
        c = {}
        for v in (1, 2):  # affine in d at each vocabulary
            c[1, v] = Fraction(n[d2, v] - n[d1, v], d2 - d1)
            c[0, v] = n[d1, v] - c[1, v] * d1
        return {(i, 1): c[i, 2] - c[i, 1] for i in (0, 1)} | {(i, 0): 2 * c[i, 1] - c[i, 2] for i in (0, 1)}

    def _outside(self, probe: DictConfig, d: int, vocab: int) -> int:
        """Non-embedding parameters outside the blocks of ``probe``'s model built at width d (changes ``probe``)."""
        probe.model.d_model = d
        model = TransformerLM(probe, vocab)
        return model_cost(model, probe).params_non_embedding - sum(p.numel() for p in model.blocks.parameters())

    @property
    def reads_vocabulary(self) -> bool:
        return any(self.outer[i, 1] for i in (0, 1))

    def __call__(self, d: float, L: float, H: float, h: float, F: float, vocab: int = 1) -> float:
        outer = sum(float(c) * d**i * vocab**j for (i, j), c in self.outer.items())
        return outer + L * self.block(d, F, H, h)


class Solver:
    """The integer shapes a request allows (:meth:`candidates`), and the pick (:meth:`solve`)."""

    def __init__(self, cfg: DictConfig, req: Request, counter: Counter, vocab: int):
        self.cfg, self.req, self.count, self.vocab = cfg, req, counter, vocab

    def n(self, d: float, L: float, H: float, h: float, F: float) -> float:
        return self.count(d, L, H, h, F, self.vocab)

    # --- sizes --------------------------------------------------------------------------------------------------
    def heads(self, d: int) -> list[tuple[int, int]]:
        """(H, h) with H h = attn_ratio x d, held ones exact, else by nearness of h to head_dim_target."""
        r = self.req
        width = r.attn_ratio * d
        A = round(width)
        if A < 1 or abs(width - A) > 1e-9:
            return []
        if r.head_dim is not None:
            return [(A // r.head_dim, r.head_dim)] if A % r.head_dim == 0 else []
        if r.n_heads is not None:
            return [(r.n_heads, A // r.n_heads)] if A % r.n_heads == 0 else []
        return sorted(((A // h, h) for h in divisors(A)), key=lambda p: abs(math.log(p[1] / r.head_dim_target)))

    def ffn(self, d: int) -> int:
        """F by the ratio (nearest multiple of d_ff_multiple, at least one) or the activation's rule."""
        r, m = self.req, self.req.d_ff_multiple
        if r.ffn_ratio is None:
            return self.count.default_d_ff(d)
        return m * max(1, math.floor(r.ffn_ratio * d / m + 0.5))

    def relaxed(self, d: int, L: int) -> float:
        """N at width d and depth L with the heads as real numbers (H h = attn_ratio x d, h at its target)."""
        r = self.req
        width = r.attn_ratio * d
        if r.n_heads is not None:
            H, h = r.n_heads, width / r.n_heads
        else:
            h = r.head_dim or r.head_dim_target
            H = width / h
        return self.n(d, L, H, h, self.ffn(d))

    def root(self, L: int) -> int:
        """The least integer width whose relaxed N at depth L reaches the target (N grows with d)."""
        T, hi = self.req.target, 1
        while self.relaxed(hi, L) < T:
            hi *= 2
        lo = hi // 2 + 1 if hi > 1 else 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.relaxed(mid, L) < T else (lo, mid)
        return lo

    def widths(self, center: float, spread: float) -> list[int]:
        """Integer widths within center x (1 +- spread) (+- 2), and the nearest width with whole heads on
        either side of that window (for the nearest feasible shape when none in it has)."""
        lo, hi = max(1, math.floor(center * (1 - spread)) - 2), math.ceil(center * (1 + spread)) + 2
        found = list(range(lo, hi + 1))
        below = next((d for d in range(lo - 1, 0, -1) if self.heads(d)), None)
        above = next((d for d in range(hi + 1, 4 * hi + 64) if self.heads(d)), None)
        return [d for d in (below, *found, above) if d is not None]

    # --- candidates ---------------------------------------------------------------------------------------------
    def at(self, d: int, L: int, miss: float = 0.0) -> Iterator[Candidate]:
        """Every candidate of width d and depth L: each allowed (H, h), d_ff by the ratio or solved for N."""
        for H, h in self.heads(d):
            for F in self.solved_ffn(d, L, H, h) if self.req.solves_d_ff else (self.ffn(d),):
                yield Candidate(d, L, H, h, F, round(self.n(d, L, H, h, F)), miss)

    def solved_ffn(self, d: int, L: int, H: int, h: int) -> list[int]:
        """The multiples of d_ff_multiple either side of the d_ff whose N is the target (N is affine in d_ff)."""
        m = self.req.d_ff_multiple
        n0 = self.n(d, L, H, h, 0)
        slope = self.n(d, L, H, h, 1) - n0
        exact = (self.req.target - n0) / slope if slope > 0 else 0.0
        below = m * max(1, math.floor(exact / m))
        return sorted({below, below + m})

    def candidates(self) -> list[Candidate]:
        r = self.req
        if r.d_model is not None and r.n_layers is not None:
            return list(self.at(r.d_model, r.n_layers))
        if r.aspect is not None and r.n_layers is not None:  # d nearest aspect x L, d_ff solved
            want = r.aspect * r.n_layers
            return [c for d in self.widths(want, 0.0) for c in self.at(d, r.n_layers, abs(math.log(d / want)))]
        if r.aspect is not None and r.d_model is not None:  # L nearest d / aspect, d_ff solved
            want = r.d_model / r.aspect
            if want < 1:
                raise bad("shape.aspect", shown(r.aspect), f"shape.d_model={r.d_model} / aspect = {want:.3g} layers, fewer "
                          f"than 1: allowed: <= {r.d_model}")  # fmt: skip
            depths = {max(1, math.floor(want)), math.ceil(want)}
            return [c for L in depths for c in self.at(r.d_model, L, abs(math.log(r.d_model / L / r.aspect)))]
        if r.n_layers is not None:
            return [c for d in self.widths(self.root(r.n_layers), r.tolerance) for c in self.at(d, r.n_layers)]
        if r.d_model is not None:
            return self.depths_at(r.d_model)
        return self.by_aspect()

    def depths_at(self, d: int) -> list[Candidate]:
        """Width held: the depths either side of the one whose N is the target (N is affine in L)."""
        out = []
        for H, h in self.heads(d):
            F = self.ffn(d)
            outer = self.n(d, 0, H, h, F)
            per_layer = self.n(d, 1, H, h, F) - outer
            exact = (self.req.target - outer) / per_layer
            for L in {max(1, math.floor(exact)), max(1, math.ceil(exact))}:
                out.append(Candidate(d, L, H, h, F, round(self.n(d, L, H, h, F))))
        return out

    def by_aspect(self) -> list[Candidate]:
        """Aspect asked, nothing held: at each depth the width whose N is the target, and the depths whose
        d / L bracket the aspect, the closer first."""
        a = self.req.aspect
        ratio = lambda L: self.root(L) / L  # falls as L grows
        if ratio(1) < a:
            raise bad("shape.aspect", shown(a), f"at shape.target_params={self.req.target:g} one layer is d_model / n_layers "
                      f"= {ratio(1):.3g}, a larger aspect needs fewer than 1 layer: allowed: <= {ratio(1):.3g}")  # fmt: skip
        hi = 2
        while ratio(hi) >= a and self.root(hi) > 1:
            hi *= 2
        lo = hi // 2  # ratio(lo) >= a
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ratio(mid) >= a else (lo, mid)
        out = []
        for L in range(max(1, lo - 1), hi + 2):
            miss = abs(math.log(ratio(L) / a))
            out += [c for d in self.widths(self.root(L), self.req.tolerance) for c in self.at(d, L, miss)]
        return out

    # --- the pick -----------------------------------------------------------------------------------------------
    def error(self, c: Candidate) -> float:
        return abs(c.n / self.req.target - 1)

    def order(self, c: Candidate) -> tuple[float, ...]:
        head = 0.0 if self.req.holds_heads else abs(math.log(c.h / self.req.head_dim_target))
        return (round(c.aspect_miss, 9), round(head, 9), self.error(c), c.d, c.L, c.F)

    def sized(self, work: DictConfig, c: Candidate) -> DictConfig:
        """``work`` with the candidate's sizes written as the run's config holds them (:func:`write`)."""
        write(work, c.d, c.L, c.H, c.h, c.F, default=not self.req.solves_d_ff and self.req.ffn_ratio is None)
        return work

    def passes(self, work: DictConfig, c: Candidate) -> ConfigError | None:
        try:
            check_sizes(self.sized(work, c))
        except ConfigError as err:
            return err
        return None

    def solve(self) -> Solution:
        """The first candidate within tolerance (in :meth:`order`) that the size rules accept and whose whole
        config validates. Candidates are tried on the config itself, its sizes restored after (a copy costs
        more than the search)."""
        found = self.candidates()
        if not found:
            raise self.no_heads()
        keys = list(SETS)
        before = [OmegaConf.select(self.cfg, k) for k in keys]
        try:
            return self._pick(found, self.cfg)
        finally:
            with open_dict(self.cfg):
                for key, value in zip(keys, before):
                    OmegaConf.update(self.cfg, key, value, merge=False)

    def _pick(self, found: list[Candidate], work: DictConfig) -> Solution:
        within = sorted((c for c in found if self.error(c) <= self.req.tolerance), key=self.order)
        failed: list[ConfigError] = []  # the whole config refused a candidate the size rules accepted
        for c in within[:CANDIDATE_CHECKS]:
            if self.passes(work, c) is not None:
                continue
            try:
                validate(self.sized(work, c))
            except ConfigError as err:
                failed.append(err)
                if len(failed) >= FULL_TRIES:
                    break
                continue
            default = not self.req.solves_d_ff and self.req.ffn_ratio is None
            return Solution(self.req, c.d, c.L, c.H, c.h, c.F, c.n, default)
        if failed:
            raise failed[0]
        raise self.infeasible(work, found)

    def infeasible(self, work: DictConfig, found: list[Candidate]) -> ConfigError:
        """No candidate within tolerance: the nearest one that the size rules accept, as a target to ask for."""
        r = self.req
        near = next((c for c in sorted(found, key=self.error)[:CANDIDATE_CHECKS] if self.passes(work, c) is None), None)
        target = shown(r.target)
        if near is None:
            return bad("shape.target_params", target, f"{r.text()} has no integer shape the model accepts")
        fewer = " (it would take fewer than 1 layer)" if near.L == 1 and near.n > r.target else ""
        return bad("shape.target_params", target, f"no integer shape of {r.text()} is within {100 * r.tolerance:g}% "
                   f"of it{fewer}; nearest feasible: shape.target_params={near.n} ({near.text()}, "
                   f"{near.n / r.target - 1:+.1%})")  # fmt: skip

    def no_heads(self) -> ConfigError:
        """No width the request allows has whole heads: say which key to change."""
        r = self.req
        d = r.d_model
        if d is not None and abs(r.attn_ratio * d - round(r.attn_ratio * d)) > 1e-9:
            return bad(
                "shape.attn_ratio", shown(r.attn_ratio), f"attn_ratio x shape.d_model={d} must be a whole number"
            )
        width = round(r.attn_ratio * d) if d is not None else None
        key, value = ("shape.head_dim", r.head_dim) if r.head_dim is not None else ("shape.n_heads", r.n_heads)
        where = f"attn_ratio x d_model = {width}" if width else "attn_ratio x d_model"
        allowed = f": allowed: {', '.join(map(str, divisors(width)))}" if width else ""
        return bad(key, value, f"must divide {where} (whole heads){allowed}")


def shown(value: float) -> float | int:
    """A number as a message shows it: 400000, not 400000.0."""
    return int(value) if float(value).is_integer() else value


def divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def write(cfg: DictConfig, d: int, L: int, H: int, h: int, F: int, default: bool) -> None:
    """Set the sizes in ``cfg``: model.head_dim null when H h = d (the model's own rule), activation.d_ff null
    when ``default`` (the activation's own rule gives F)."""
    with open_dict(cfg):
        cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads = d, L, H
        cfg.model.head_dim = None if H * h == d else h
        cfg.activation.d_ff = None if default else F


_COUNTERS: dict[str, Counter] = {}  # by the model's options (not its sizes) and the probe heads
_SOLVED: dict[str, Solution] = {}  # by those, the request and the vocabulary: a sweep's seeds and LRs share one


def _options_key(cfg: DictConfig) -> str:
    """What a count depends on: the model's options, not its sizes (nor the run's vocabulary: an argument)."""
    parts = OmegaConf.to_container(OmegaConf.masked_copy(cfg, ["model", "norm", "position", "activation",
                                                               "attention"]), resolve=True)  # fmt: skip
    for node, key in (k.split(".") for k in (*SETS, "model.vocab_size")):
        parts[node].pop(key, None)  # type: ignore[index,union-attr]
    return json.dumps(parts, sort_keys=True, default=str)


def _cached(cache: dict[str, Any], key: str, make: Any) -> Any:
    if key not in cache:
        if len(cache) > 1024:
            cache.clear()
        cache[key] = make()
    return cache[key]


def solve(cfg: DictConfig, vocab: int | None = None) -> Solution:
    """The shape ``cfg``'s ``shape`` node asks for (cached). ``vocab``: the run's vocabulary, read only when N
    depends on it (an untied head): default model.vocab_size if set, else lm_ablate.data.vocabulary(cfg.data)."""
    req = Request.of(cfg.shape)
    n_kv = cfg.attention.n_kv_heads or 1  # gqa: the heads must be a multiple of the K/V heads
    heads = (req.n_heads or 2 * n_kv, req.head_dim or req.head_dim_target)  # the probes': the config's rules hold
    options = _options_key(cfg)
    counter = _cached(_COUNTERS, f"{options}{heads}", lambda: Counter(cfg, heads))
    if not counter.reads_vocabulary:
        vocab = 1  # any: no non-embedding parameter has the vocabulary's size
    elif vocab is None:
        vocab = cfg.model.vocab_size or vocabulary(cfg.data).size
    key = json.dumps([options, dataclasses.asdict(req), vocab], sort_keys=True)
    return _cached(_SOLVED, key, lambda: Solver(cfg, req, counter, vocab).solve())


def apply_shape(cfg: DictConfig, explicit: Iterable[str] = (), vocab: int | None = None) -> Solution | None:
    """Give ``cfg`` the sizes its ``shape=iso`` request solves to; None (nothing changed) with shape=none.
    ``explicit``: the dotted keys the command line set: a size shape=iso sets is refused there (one line naming
    the shape key that holds it), and taken over when a file set it. Changes ``cfg``; applying it again changes
    nothing."""
    shape = getattr(cfg, "shape", None)
    if shape is None or shape.name != "iso":
        check_shape(cfg)  # shape=none: no shape key may be set
        return None
    given = set(explicit)
    for key, holder in SETS.items():
        if key in given:
            raise bad(key, OmegaConf.select(cfg, key), f"shape=iso sets it: hold it with {holder} (or shape=none)")
    check_shape(cfg)
    if shape.head_dim is not None or shape.n_heads is not None:  # held heads: no target to be near
        if "shape.head_dim_target" in given and shape.head_dim_target is not None:
            held = "shape.head_dim" if shape.head_dim is not None else "shape.n_heads"
            raise bad("shape.head_dim_target", shape.head_dim_target, f"{held} holds the heads exactly: leave it out")
        with open_dict(cfg):
            cfg.shape.head_dim_target = None
    s = solve(cfg, vocab)
    write(cfg, s.d_model, s.n_layers, s.n_heads, s.head_dim, s.d_ff, s.d_ff_default)
    return s


__all__ = ["Counter", "Request", "Solution", "apply_shape", "solve"]
