"""The coverage check of the error bands, with power (docs/perfmodel.md "Error bands").

A count of runs inside their band ("13 of 13 inside the pooled ±22.3 %") alone cannot fail a
predictor that knows nothing, where the runs vary less than the band is wide: a constant, the runs'
own median, lands 11 of those 13 inside. So the check asks three things of the runs that set no band,
each a test at ALPHA, and passes only where none fails:

1. **coverage**: the count inside is not below the bands' declared coverage. Each run is inside with
   probability its band's declared coverage (a regime band's error_bands.COVERAGE, the pooled band's
   POOLED_COVERAGE), so the count is Poisson-binomial; the check fails where at most the count seen
   has probability under ALPHA (`at_most_p`).
2. **skill**: the predictions order the runs as the published values do: Kendall's tau-b between the
   two is positive with a one-sided permutation p under ALPHA (the published values dealt out over
   the runs in PERMUTATIONS orders drawn with a fixed seed; p = (1 + orders at least as concordant)
   / (1 + PERMUTATIONS)). A constant has no order (tau 0, p 1): it cannot pass, whatever its count.
3. **centred**: the errors do not lean one way: a two-sided sign test of the signed errors (zeros
   dropped) has p at least ALPHA. The band is an interval of |error| about 0, set on runs whose errors
   centre near 0; runs whose errors lean one way are not exchangeable with them, and exchangeability
   is what the band's coverage rests on (error_bands.py). A model missing a term that every run needs
   (its time left out, every run predicted too fast) leans one way.

Each criterion can fail only from a number of runs on (`FEWEST_TO_FAIL`: coverage 2, skill 4, centred
6); under those it is reported as unable to fail (it could not pass either), never as passed or failed.
Pure arithmetic on the runs' predictions, published values and bands: the predictions themselves come
from fitting/coverage_power.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zerobench.perfmodel.error_bands import COVERAGE, POOLED_COVERAGE, REGIME_BASIS

ALPHA = 0.05
PERMUTATIONS = 20_000
SEED = 0


def declared(band_basis: str) -> float:
    """The declared coverage of a run's band, from its `band_basis`: a regime's or the pooled one's."""
    return COVERAGE if band_basis == REGIME_BASIS else POOLED_COVERAGE


def at_most_p(inside: int, coverages) -> float:
    """P(at most `inside` runs inside), each run inside with its own probability (`coverages`: one per
    run, or a number of runs at COVERAGE): the one-sided test of a declared coverage."""
    probs = [COVERAGE] * coverages if isinstance(coverages, int) else [float(c) for c in coverages]
    dist = np.zeros(len(probs) + 1)  # dist[k]: P(k inside) over the runs so far
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return min(1.0, float(dist[: inside + 1].sum()))


def _pairs(x: np.ndarray) -> np.ndarray:
    """sign(x_i - x_j) over the pairs i < j, along the last axis."""
    i, j = np.triu_indices(x.shape[-1], k=1)
    return np.sign(x[..., i] - x[..., j])


def kendall_tau(pred, actual) -> float:
    """Kendall's tau-b of two sequences (0 where either is constant)."""
    a, b = _pairs(np.asarray(pred, float)), _pairs(np.asarray(actual, float))
    den = math.sqrt(np.count_nonzero(a) * np.count_nonzero(b))
    return float((a * b).sum() / den) if den else 0.0


def skill_p(pred, actual, permutations: int = PERMUTATIONS, seed: int = SEED) -> tuple[float, float]:
    """(tau-b, its one-sided permutation p): how often the published values dealt out at random over
    the runs are at least as concordant with the predictions. A constant prediction: (0, 1)."""
    pred, actual = np.asarray(pred, float), np.asarray(actual, float)
    tau = kendall_tau(pred, actual)
    a = _pairs(pred)
    if not np.count_nonzero(a) or not np.count_nonzero(_pairs(actual)):
        return 0.0, 1.0
    dealt = np.random.default_rng(seed).permuted(np.tile(actual, (permutations, 1)), axis=1)
    concordance = (_pairs(dealt) * a).sum(axis=1)
    seen = (a * _pairs(actual)).sum()
    return tau, float((1 + np.count_nonzero(concordance >= seen)) / (1 + permutations))


def sign_p(errors) -> tuple[int, int, float]:
    """(runs below 0, runs above 0, two-sided sign test p), zeros dropped."""
    e = np.asarray(errors, float)
    below, above = int((e < 0).sum()), int((e > 0).sum())
    n, k = below + above, min(below, above)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return below, above, p


def _fewest(fails) -> int:
    return next(n for n in range(1, 100) if fails(n))


# Fewest runs at which each criterion can fail at all: none inside at the lower declared coverage;
# a perfect order's permutation p (1/n!); every error on one side (2 / 2^n).
FEWEST_TO_FAIL = {
    "coverage": _fewest(lambda n: at_most_p(0, n) < ALPHA),
    "skill": _fewest(lambda n: 1 / math.factorial(n) < ALPHA),
    "centred": _fewest(lambda n: 2 / 2**n < ALPHA),
}


@dataclass(frozen=True)
class Check:
    """One predictor's check on the runs that set no band."""

    runs: int
    inside: int
    coverage_p: float
    tau: float
    skill_p: float
    below: int
    above: int
    sign_p: float
    mean_abs_pct: float
    mean_pct: float

    @property
    def failed(self) -> tuple[str, ...]:
        """The criteria that failed (module docstring), of those the runs are enough to judge."""
        out = []
        if self.coverage_p < ALPHA:
            out.append("coverage")
        if not (self.tau > 0 and self.skill_p < ALPHA):
            out.append("skill")
        if self.sign_p < ALPHA:
            out.append("centred")
        return tuple(c for c in out if c not in self.cannot_fail)

    @property
    def cannot_fail(self) -> tuple[str, ...]:
        """The criteria too few runs leave unable to fail (FEWEST_TO_FAIL)."""
        return tuple(c for c, n in FEWEST_TO_FAIL.items() if self.runs < n)

    @property
    def passes(self) -> bool:
        return not self.failed and not self.cannot_fail


def check(predicted, published, band_pct, band_basis) -> Check:
    """The check of predictions against published values, each run judged by its band (`band_pct`,
    named by `band_basis`, which gives its declared coverage)."""
    pred, pub = np.asarray(predicted, float), np.asarray(published, float)
    err = 100 * (pred - pub) / pub
    inside = int((np.abs(err) <= np.asarray(band_pct, float)).sum())
    tau, p_skill = skill_p(pred, pub)
    below, above, p_sign = sign_p(err)
    return Check(runs=len(err), inside=inside, coverage_p=at_most_p(inside, [declared(b) for b in band_basis]),
                 tau=tau, skill_p=p_skill, below=below, above=above, sign_p=p_sign,
                 mean_abs_pct=float(np.abs(err).mean()), mean_pct=float(err.mean()))  # fmt: skip
