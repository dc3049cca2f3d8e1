"""How many samples a pass-rate estimate draws: k for every problem, or in rounds until
its interval has decided the band (filter.adaptive).

    plan = StopPlan.from_config(cfg)            # None: fixed k
    draws = draw_estimates(backend, prompts, seeds, params, budgets, priors, correct, plan)

Adaptive: every problem first draws `adaptive_start` samples, then `adaptive_step` more
per round, and stops as soon as the Wilson interval of its counts at
`adaptive_confidence` lies wholly outside the band (too easy or too hard, whatever more
samples say) or wholly inside it, or when its budget (k) is spent. The band decision is
then the same rule as for a fixed estimate, the point estimate (inside every Wilson
interval) against the band; the stored interval stays the 95% one.

Exact (`filter.adaptive: exact`): a problem stops once it has been solved and failed and
its point estimate after all k samples falls in the same class whatever the rest turn out
to be (with band [1/8, 7/8] and k 8: at its first success and first failure). What the
filter hands on, the kept set and the problems solved only sometimes, is the fixed-k
filter's, always; only stored counts are shorter (4-36% fewer samples in the main job's
filters: docs/benchmarks.md).

Sample j of a problem is drawn from its own seed and j (grpo_core.generation.sampling,
`start`), so an adaptive estimate's samples are the first n of the fixed-k estimate's,
whatever the rounds, chunks or shards: the adaptive filter decides exactly as the
fixed one would after n samples. Problems advance in lockstep (all draw round r
together), so one `sample_seeded` call per round fills batches across problems.

Prior evidence (grpo_core.eval.evidence: pseudo-counts from the previous round's
rollouts) adds to the counts the rule tests, and the budget is k less the whole samples
the prior counts for: every problem still draws at least its first round fresh.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from grpo_core.eval.passrate import classify, wilson_interval, z_for
from grpo_core.generation.rollout import Completion, SamplingParams
from grpo_core.generation.sampling import sample_seeded

_TOL = 1e-9  # as passrate's band tolerance: the band is inclusive


class Evidence(NamedTuple):
    """Pseudo-counts a problem's estimate starts from (weighted, so fractional)."""

    successes: float = 0.0
    samples: float = 0.0


NO_EVIDENCE = Evidence()


@dataclass(frozen=True)
class StopPlan:
    """The adaptive rule's parameters (filter.adaptive_*, filter.band)."""

    start: int
    step: int
    z: float | None  # None: the exact rule
    band: tuple[float, float]

    @classmethod
    def from_config(cls, cfg) -> StopPlan | None:
        f = cfg.filter
        if not f.adaptive:
            return None
        z = None if f.adaptive == "exact" else z_for(f.adaptive_confidence)
        return cls(f.adaptive_start, f.adaptive_step, z, tuple(f.band))

    def decided(self, successes: float, n: float, remaining: float = 0.0) -> bool:
        """Interval rule: True when the interval of successes/n lies wholly outside the band
        or wholly inside it: more samples could still move the estimate, not (at this
        confidence) its class. Exact rule: True when every outcome of the `remaining`
        samples leaves the final estimate in one class, and in (0, 1) (the problems the
        policy sometimes solves: the round's fallback when the band keeps too few)."""
        if n <= 0:
            return False
        if self.z is None:
            total = n + remaining
            signal = 0 < successes < n  # solved and failed already: in (0, 1) for good
            return (remaining <= 0 or signal) and (
                classify(successes / total, self.band)
                == classify((successes + remaining) / total, self.band))
        lo, hi = wilson_interval(successes, n, self.z)
        blo, bhi = self.band
        return hi < blo - _TOL or lo > bhi + _TOL or (lo >= blo - _TOL and hi <= bhi + _TOL)

    def next_count(self, drawn: int, budget: int) -> int:
        """Samples a problem holds after its next round."""
        return min(budget, self.start if drawn == 0 else drawn + self.step)


def budget(k: int, prior: Evidence = NO_EVIDENCE) -> int:
    """Fresh samples a problem may draw: k less the whole samples its prior counts for
    (evidence caps a prior at k/2, so at least half of k stays fresh)."""
    return max(1, k - math.floor(prior.samples + _TOL))


@dataclass
class Draws:
    """One problem's fresh samples (its samples 0..n-1, in order) and their outcomes."""

    completions: list[Completion]
    outcomes: list[bool]

    @property
    def successes(self) -> int:
        return sum(self.outcomes)


def draw_estimates(backend, prompts: list[str], seeds: list[int], params: SamplingParams,
                   budgets: list[int], priors: list[Evidence],
                   correct: Callable[[int, list[Completion]], list[bool]],
                   plan: StopPlan | None) -> list[Draws]:
    """Per problem, its fresh samples: all `budgets[i]` at once (plan None), else round by
    round until `plan` has decided it with `priors[i]` added. `correct(i, completions)`
    scores problem i's new completions. Sample j of problem i is the j-th sample of
    seeds[i], however the rounds fall."""
    draws = [Draws([], []) for _ in prompts]
    active = [i for i, b in enumerate(budgets) if b > 0]
    while active:
        # Same holdings (lockstep), so a group is (first new index, how many): one call each.
        groups: Mapping[tuple[int, int], list[int]] = defaultdict(list)
        for i in active:
            have = len(draws[i].outcomes)
            want = budgets[i] if plan is None else plan.next_count(have, budgets[i])
            groups[(have, want - have)].append(i)
        for (start, n), idx in sorted(groups.items()):
            outs = sample_seeded(backend, [prompts[i] for i in idx], n, params,
                                 [seeds[i] for i in idx], start=start)
            for i, comps in zip(idx, outs):
                draws[i].completions += comps
                draws[i].outcomes += [bool(c) for c in correct(i, comps)]
        active = [i for i in active if len(draws[i].outcomes) < budgets[i] and not (
            plan is not None and plan.decided(draws[i].successes + priors[i].successes,
                                              len(draws[i].outcomes) + priors[i].samples,
                                              budgets[i] - len(draws[i].outcomes)))]
    return draws
