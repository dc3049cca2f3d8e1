"""Diagnosis rules over a GRPO round's per-step metrics: the one home of every rule.

The input is the history TRL logs, one dict per logged step with TRL's keys (`step`,
`reward`, `reward_std`, `frac_reward_zero_std`, `completions/mean_length`,
`completions/clipped_ratio`, `kl`, `entropy`, `loss`, `rewards/<fn>/mean`,
`rewards/<fn>/std`, ...); a rule whose keys are missing stays silent. Three uses:

- `RoundMonitor`: the in-round rules, fed one step at a time by the Monitor callback: the
  collapse note, and the non-finite and KL-ceiling stops (each a `Finding`).
- `start_collapse(pass_rates, cfg)`: before a round, over its difficulty filter's estimates
  under the round's input model: no problem solved sometimes means every group starts
  collapsed (reward_collapse_zero / _one / no_diversity, a stop with
  diagnosis.stop_on_collapsed_start: the pipeline raises CollapsedStart before training).
- `diagnose(history, cfg)`: every rule over a finished round, as `Finding`s (a stable
  `code`, a `severity` info|warn|stop, the `steps`, the `evidence` and the `action`;
  grpo_core/findings.py, with how findings are counted and tagged). The GRPO stage
  logs them as diagnosis.json; `grpo diagnose` prints them.

Thresholds are config fields: `diagnosis` (DiagnosisConfig), plus rounds.kl_ceiling, which
stops a round. Trends: a least-squares line over the round's steps (robust to one noisy step)."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence

from grpo_core.config import PipelineConfig
from grpo_core.findings import Finding
from grpo_core.train.batch_patterns import SHARE_METRICS
from grpo_core.train.metric_series import (
    fit_change,
    mean_of,
    number_or_none,
    round4,
    runs_where,
    series_of,
    windows_where,
)

ACCURACY = "rewards/accuracy/mean"
ACCURACY_STD = "rewards/accuracy/std"  # over the whole batch (TRL logs no per-group std)
FINITE_KEYS = ("loss", "reward", "grad_norm")  # the in-round divergence guard's keys


def is_step_log(logs: Mapping) -> bool:
    """A per-step training log (not the end-of-training summary, not a stage metric)."""
    return "loss" in logs or "reward" in logs


def parse_history(lines: Iterable[str]) -> list[dict]:
    """JSON lines of per-step metric dicts (blank lines skipped). A line that is not a JSON
    object raises ValueError naming its line number."""
    rows = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"line {n}: expected a JSON object of metrics, got {type(row).__name__}")
        rows.append(row)
    return rows


# ------------------------------------------------------------------------ in-round rules

class RoundMonitor:
    """The in-round rules on each logged step: a collapse note when frac_reward_zero_std
    stays above diagnosis.collapse_threshold for diagnosis.collapse_patience steps; a stop
    on a non-finite loss, reward or grad norm, on KL above rounds.kl_ceiling, and on a reward
    function returning NaN/inf."""

    def __init__(self, cfg: PipelineConfig):
        self.g, self.d = cfg.rounds, cfg.diagnosis
        self.collapsed_for = 0

    def observe(self, logs: Mapping, step: int) -> tuple[list[Finding], Finding | None]:
        """(notes, the stop or None) for one step's logs."""
        g, d, notes = self.g, self.d, []
        frac = logs.get("frac_reward_zero_std")
        if frac is not None:
            self.collapsed_for = self.collapsed_for + 1 if frac > d.collapse_threshold else 0
            if self.collapsed_for == d.collapse_patience:
                notes.append(Finding.note(
                    "collapse", f"frac_reward_zero_std > {d.collapse_threshold} for "
                    f"{d.collapse_patience} steps (step {step})", "info", steps=[step],
                    threshold=d.collapse_threshold, patience=d.collapse_patience))
        for key in FINITE_KEYS:
            v = logs.get(key)
            if v is not None and not math.isfinite(v):
                return notes, Finding.note("nonfinite", f"{key} is {v} at step {step}", "stop",
                                           steps=[step], metric=key, value=str(v))
        kl = logs.get("kl")
        if g.kl_ceiling is not None and kl is not None and kl > g.kl_ceiling:
            return notes, Finding.note("kl_ceiling", f"kl {kl:.4g} above kl_ceiling {g.kl_ceiling} "
                                       f"at step {step}", "stop", steps=[step], kl=kl)
        return notes, None

    @staticmethod
    def reward_stop(name: str, value: float, step: int) -> Finding:
        """The stop for a reward function that returned NaN/inf during `step`."""
        return Finding.note("nonfinite", f"reward {name} returned {value} at step {step}", "stop",
                            steps=[step], reward=name, value=str(value))


# ------------------------------------------------------------------------ before the round

class CollapsedStart(RuntimeError):
    """A round refused before its first step: start_collapse's stop `finding`, in its words."""

    def __init__(self, message: str, finding: Finding | None = None):
        super().__init__(message)  # pickled with its __dict__: the finding travels too
        self.finding = finding or Finding.note("rounds_stopped", message, "stop")


def _collapse_code(level: float, margin: float) -> str:
    """The collapse code of a mean accuracy `level` (a fraction of its range)."""
    return ("reward_collapse_zero" if level <= margin else
            "reward_collapse_one" if level >= 1 - margin else "no_diversity")


def start_collapse(pass_rates: Sequence[float], cfg: PipelineConfig | None = None,
                   round_no: int = 1) -> Finding | None:
    """The difficulty filter's estimates under the model a round starts from, read before
    any step: when no problem's pass rate lies strictly between 0 and 1, every group of
    completions the round draws is equally right (or wrong) under the accuracy reward, its
    advantages are zero and the round has nothing to learn the task from (R1-Zero on a base
    model that never writes the strict answer format: every reward 0). Named by the mean
    pass rate as the in-round collapse rule names it; severity stop with
    diagnosis.stop_on_collapsed_start, else warn. None when some problem is solved
    sometimes, or when nothing was estimated."""
    d = (cfg or PipelineConfig()).diagnosis
    rates = [float(r) for r in pass_rates]
    if not rates or any(0.0 < r < 1.0 for r in rates):
        return None
    always = sum(r >= 1.0 for r in rates)
    mean = always / len(rates)
    evidence = {"round": round_no, "problems": len(rates), "solved_sometimes": 0,
                "never_solved": len(rates) - always, "always_solved": always,
                "mean_pass_rate": round4(mean)}
    return Finding(_collapse_code(mean, d.level_margin),
                   "stop" if d.stop_on_collapsed_start else "warn", [], evidence,
                   f"before round {round_no}: the filter solved none of {len(rates)} problems "
                   f"only sometimes ({len(rates) - always} never, {always} always, under the "
                   "round's input model): every group's accuracy reward is equal, no step "
                   "would have a gradient")


# ------------------------------------------------------------------------ after the round

class _Round:
    """One round's rows and the accuracy measure the rules share."""

    def __init__(self, history: Iterable[Mapping], cfg: PipelineConfig):
        self.g, self.d = cfg.rounds, cfg.diagnosis
        self.rows = [(int(number_or_none(r.get("step")) or i), r) for i, r in enumerate(history, 1)]
        self.fns = sorted({k.split("/")[1] for _, r in self.rows for k in r
                           if k.startswith("rewards/") and k.count("/") == 2})
        if any(ACCURACY in r for _, r in self.rows):
            self.acc_key, self.acc_lo, self.acc_hi = ACCURACY, 0.0, 1.0
        else:
            self.acc_key, (self.acc_lo, self.acc_hi) = "reward", self.d.reward_range
        self.acc = series_of(self.rows, self.acc_key)

    def level(self, value: float) -> float:
        """An accuracy (or reward) as a fraction of its range: 0 at the floor, 1 at the ceiling."""
        return (value - self.acc_lo) / (self.acc_hi - self.acc_lo)

    def acc_change(self) -> float:
        return fit_change(self.acc) / (self.acc_hi - self.acc_lo)


def _nonfinite(rd: _Round) -> list[Finding]:
    keys = FINITE_KEYS + ("kl",) + tuple(f"rewards/{f}/mean" for f in rd.fns)
    bad = {s: [k for k in keys if (x := number_or_none(r.get(k))) is not None and not math.isfinite(x)]
           for s, r in rd.rows}
    bad = {s: ks for s, ks in bad.items() if ks}
    if not bad:
        return []
    first = min(bad)
    return [Finding("nonfinite", "stop", sorted(bad), {"first_step": first, "keys": bad[first]},
                    f"{', '.join(bad[first])} not finite at step {first}")]


def _kl_ceiling(rd: _Round) -> list[Finding]:
    ceiling = rd.g.kl_ceiling
    over = [(s, x) for s, x in series_of(rd.rows, "kl") if ceiling is not None and x > ceiling]
    if not over:
        return []
    top = max(x for _, x in over)
    return [Finding("kl_ceiling", "stop", [s for s, _ in over], {"kl": round4(top), "kl_ceiling": ceiling},
                    f"kl {top:.4g} > rounds.kl_ceiling {ceiling}")]


def _collapse(rd: _Round) -> list[Finding]:
    """Runs of diagnosis.collapse_patience+ collapsed steps, named by where accuracy sits over
    the run. Collapsed: a window of collapse_patience steps whose mean frac_reward_zero_std
    is above diagnosis.collapse_threshold (a window, not each step: with 8 prompts a step is 1.0
    or 0.875, and one group that varies now and then must not hide a collapse). When
    rewards/accuracy is logged, also: collapse_patience+ steps with its std ~0 (every
    completion equally right or wrong: no group learns the task, even while a shaping
    reward varies), and a window whose mean accuracy is within level_margin of the ceiling
    (the pool is learned; its rare misses are sampling noise at temperature 1, which keeps
    frac_reward_zero_std below the threshold: at 97% right, 0.97^8 = 78% of groups of 8
    are all right). Not the floor by level alone: a base model's first successes, a few
    percent, are how R1-Zero starts learning. A run starts and ends at a step collapsed on
    its own, not at a window's milder edge."""
    d, margin, n = rd.d, rd.d.level_margin, rd.d.collapse_patience
    frac_pts = series_of(rd.rows, "frac_reward_zero_std")
    frac, acc_std = dict(frac_pts), dict(series_of(rd.rows, ACCURACY_STD))
    acc = dict(rd.acc) if rd.acc_key == ACCURACY else {}
    constant = {s for run in runs_where(list(acc_std.items()), lambda v: abs(v) <= d.constant_std)
                if len(run) >= n for s, _ in run}
    flagged = (windows_where(frac_pts, n, lambda m: m > d.collapse_threshold) | constant
               | windows_where(list(acc.items()), n, lambda m: rd.level(m) >= 1 - margin))

    def alone(s: int) -> bool:
        return (frac.get(s, 0.0) > d.collapse_threshold or s in constant
                or (s in acc and rd.level(acc[s]) >= 1 - margin))

    out = []
    for run in runs_where([(s, s in flagged) for s, _ in rd.rows], bool):
        ends = [i for i, (s, _) in enumerate(run) if alone(s)]
        steps = [s for s, _ in run[ends[0]:ends[-1] + 1]] if ends else []
        accs = [x for s, x in rd.acc if s in set(steps)]
        if len(steps) < n or not accs:
            continue
        mean_acc = mean_of(accs)
        code = _collapse_code(rd.level(mean_acc), margin)
        mean_frac = mean_of(frac[s] for s in steps if s in frac)
        name = rd.acc_key.removeprefix("rewards/").removesuffix("/mean")
        why = (f"frac_reward_zero_std {mean_frac:.2f} > {d.collapse_threshold}"
               if mean_frac > d.collapse_threshold else
               f"{name} the same for every completion" if set(steps) <= constant else
               f"{name} within {margin:.0%} of its ceiling (frac_reward_zero_std {mean_frac:.2f})")
        out.append(Finding(code, "warn", steps,
                           {"frac_reward_zero_std": round4(mean_frac), "threshold": d.collapse_threshold,
                            rd.acc_key: round4(mean_acc), "steps": len(steps)},
                           f"{why} for {len(steps)} steps, {name} {mean_acc:.3g}"))
    return out


def _reward_fn_constant(rd: _Round) -> list[Finding]:
    """A reward function's std ~0 for constant_patience steps; not within a collapse
    (there every function is constant, and the collapse finding says why). Info while the
    round still learns the task over most of those steps (accuracy varies and the step is
    not collapsed): a shaping reward not hit yet, as the R1-Zero format on a base model,
    adds the same to every advantage and costs nothing. Else (accuracy not logged, or
    constant too) a warn."""
    d, out = rd.d, []
    collapsed = {s for f in _collapse(rd) for s in f.steps}
    acc_std = dict(series_of(rd.rows, ACCURACY_STD))
    for fn in rd.fns:
        stds = series_of(rd.rows, f"rewards/{fn}/std")
        runs = [r for r in runs_where(stds, lambda v: abs(v) <= d.constant_std) if len(r) >= d.constant_patience]
        if not runs:
            continue
        run = max(runs, key=len)
        steps = [s for s, _ in run]
        if set(steps) <= collapsed:
            continue
        means = [x for s, x in series_of(rd.rows, f"rewards/{fn}/mean") if s in set(steps)]
        value = mean_of(means) if means else None
        learning = sum(acc_std.get(s, 0.0) > d.constant_std and s not in collapsed
                       for s in steps) > len(steps) / 2
        out.append(Finding("reward_fn_constant", "info" if learning else "warn", steps,
                           {"reward": fn, "std_max": round4(max(abs(v) for _, v in run)),
                            "mean": None if value is None else round4(value), "steps": len(steps)},
                           f"rewards/{fn}/std <= {d.constant_std} for {len(steps)} steps"
                           + ("" if value is None else f" (mean {value:.3g})")))
    return out


def _length(rd: _Round) -> list[Finding]:
    d = rd.d
    lengths = series_of(rd.rows, "completions/mean_length")
    level = mean_of(x for _, x in lengths)
    if len(lengths) < d.window or level <= 0:
        return []
    rel = fit_change(lengths) / level
    acc = rd.acc_change()
    if acc > d.min_change or abs(rel) < d.length_trend:
        return []
    code = "length_shrinking" if rel < 0 else "length_exploding"
    return [Finding(code, "warn", [s for s, _ in lengths],
                    {"length_change": round4(rel), "threshold": d.length_trend,
                     "length_first": round4(lengths[0][1]), "length_last": round4(lengths[-1][1]),
                     "accuracy_change": round4(acc)},
                    f"mean length {rel:+.0%} over the round (|change| >= {d.length_trend:.0%}) "
                    f"while {rd.acc_key} changed {acc:+.3f}")]


def _truncation(rd: _Round) -> list[Finding]:
    """The last `window` steps' mean clipped_ratio; silent before `window` steps: a base
    model's first steps truncate often (28-41% at step 1 of the shipped R1-Zero recipe's
    healthy rounds, ~6% by step 20), so a shorter round cannot tell a fault from a start."""
    d = rd.d
    clipped = series_of(rd.rows, "completions/clipped_ratio")
    tail = clipped[-d.window:]
    ratio = mean_of(x for _, x in tail)
    if len(clipped) < d.window or ratio <= d.truncation_ratio:
        return []
    steps = [s for s, x in clipped if x > d.truncation_ratio]
    return [Finding("truncation", "warn", steps,
                    {"clipped_ratio": round4(ratio), "threshold": d.truncation_ratio, "window": len(tail)},
                    f"clipped_ratio {ratio:.2f} > {d.truncation_ratio} (mean of the last {len(tail)} steps)")]


def _format_dropping(rd: _Round) -> list[Finding]:
    d = rd.d
    fmt = series_of(rd.rows, "rewards/format/mean")
    if len(fmt) < d.window:
        return []
    change = fit_change(fmt)
    if change > -d.format_drop:
        return []
    return [Finding("format_dropping", "warn", [s for s, _ in fmt],
                    {"format_change": round4(change), "threshold": d.format_drop,
                     "format_first": round4(fmt[0][1]), "format_last": round4(fmt[-1][1])},
                    f"rewards/format/mean fell {change:+.3f} over the round (threshold -{d.format_drop})")]


def _kl_rising(rd: _Round) -> list[Finding]:
    """KL rising over the round and still rising, above diagnosis.kl_floor; or, rising or
    not, above diagnosis.kl_high at the end (a policy pushed far off the reference in a few
    steps, then held there by the beta term, has a falling tail but has diverged)."""
    d = rd.d
    kl = series_of(rd.rows, "kl")
    tail = kl[-d.window:]
    if len(kl) < d.window:
        return []
    end = mean_of(x for _, x in tail)
    rise, tail_rise = fit_change(kl), fit_change(tail)
    rising = rise > 0 and tail_rise > 0 and end > d.kl_floor
    if not (rising or end > d.kl_high):
        return []
    evidence = {"kl_end": round4(end), "kl_floor": d.kl_floor, "kl_high": d.kl_high,
                "kl_change": round4(rise), "kl_change_last_window": round4(tail_rise)}
    if rising:
        return [Finding("kl_rising", "warn", [s for s, _ in kl], evidence,
                        f"kl rising {rise:+.3g} over the round and still rising, at {end:.3g} > {d.kl_floor}")]
    peak = max(kl, key=lambda p: p[1])
    return [Finding("kl_rising", "warn", [s for s, x in kl if x > d.kl_high], evidence,
                    f"kl {end:.3g} over the last {len(tail)} steps > {d.kl_high} (peak {peak[1]:.3g} "
                    f"at step {peak[0]})")]


def _reward_hacking(rd: _Round) -> list[Finding]:
    d, out = rd.d, []
    if rd.acc_key != ACCURACY or len(rd.acc) < d.window:
        return []
    acc = rd.acc_change()
    if acc >= -d.min_change:
        return []
    for fn in rd.fns:
        if fn == "accuracy":
            continue
        means = series_of(rd.rows, f"rewards/{fn}/mean")
        rise = fit_change(means)
        if len(means) >= d.window and rise > d.min_change:
            out.append(Finding("reward_hacking_suspect", "warn", [s for s, _ in means],
                               {"reward": fn, "reward_change": round4(rise), "accuracy_change": round4(acc),
                                "threshold": d.min_change},
                               f"rewards/{fn}/mean {rise:+.3f} while accuracy {acc:+.3f} over the round"))
    return out


def _repeated_pattern(rd: _Round) -> list[Finding]:
    """One wrong completion pattern under most prompts of the batches
    (grpo_core/train/batch_patterns.py): windows of `window` logged steps (all of them in a
    shorter round) whose mean share is above diagnosis.repeated_pattern_share."""
    d, out = rd.d, []
    for kind, key in SHARE_METRICS.items():
        shares = series_of(rd.rows, key)
        if not shares:
            continue
        n = min(d.window, len(shares))
        flagged = windows_where(shares, n, lambda m: m > d.repeated_pattern_share)
        steps = [s for s, x in shares if s in flagged and x > d.repeated_pattern_share]
        if not steps:
            continue
        top = max(x for s, x in shares if s in steps)
        out.append(Finding("reward_hacking_suspect", "warn", steps,
                           {"pattern": kind, "share": round4(top), "threshold": d.repeated_pattern_share,
                            "window": n},
                           f"one wrong completion {kind} under {top:.0%} of a batch's prompts "
                           f"(> {d.repeated_pattern_share:.0%} over {n} steps)"))
    return out


RULES = (_nonfinite, _kl_ceiling, _collapse, _reward_fn_constant, _length, _truncation,
         _format_dropping, _kl_rising, _reward_hacking, _repeated_pattern)


def diagnose(history: Iterable[Mapping], cfg: PipelineConfig | None = None) -> list[Finding]:
    """Every rule over a round's per-step history (TRL's keys), in rule order."""
    rd = _Round(history, cfg or PipelineConfig())
    return [f for rule in RULES for f in rule(rd)]
