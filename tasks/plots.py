"""The pipeline's PNG charts (its only matplotlib): a training run's curves, the filter's
pass-rate histogram and the recipe comparison's bars. Drawn on the Agg canvas directly (no
pyplot): no display needed, no global backend switched under a notebook that imported us,
thread-safe.

GRPO panels lead with what says whether the round learns (total reward, each reward
function, accuracy), then what usually explains why not (length, truncation at the cap,
groups with no reward spread, hence no advantage), then the optimizer's side (kl, ...), then speed (throughput/*).
Keys are TRL 1.16's GRPOTrainer log keys plus in-round eval's `in_round_eval/accuracy` and
the round's throughput/* (grpo_core.train.throughput)."""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ACCURACY = "rewards/accuracy/mean"  # grpo_core.verify.rewards.accuracy: TRL names it by __name__
IN_ROUND = "in_round_eval/accuracy"  # held-out greedy score, only on eval_every steps
_PER_FUNC = re.compile(r"rewards/(.+)/mean")


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[tuple[str, str, str], ...]  # (key, legend label, style: "-" main, ":" aside, "o" points)
    band: tuple[str, str] | None = None  # (mean key, std key): shaded mean +- std
    share: bool = False  # a fraction: fixed 0..1 axis, so a flat 1.0 doesn't read as noise


def _line(key: str, label: str | None = None, style: str = "-") -> tuple[str, str, str]:
    return key, label or key, style


GRPO_PANELS = [
    Panel("reward (mean +- std)", (_line("reward"),), band=("reward", "reward_std")),
    Panel("reward per function", ()),  # filled from the history's rewards/<fn>/mean keys
    Panel("accuracy", (_line(ACCURACY, "train samples"), _line(IN_ROUND, "in-round eval", "o")),
          share=True),
    Panel("completion length (tokens)", (_line("completions/mean_length", "mean"),
                                         _line("completions/min_length", "min", ":"),
                                         _line("completions/max_length", "max", ":"))),
    Panel("truncated at max length (completions/clipped_ratio)",
          (_line("completions/clipped_ratio"),), share=True),
    Panel("groups with zero reward std (frac_reward_zero_std)",
          (_line("frac_reward_zero_std"),), share=True),
    *(Panel(k, (_line(k),)) for k in ("kl", "entropy", "clip_ratio/region_mean", "loss",
                                      "grad_norm", "learning_rate")),
    # How fast (grpo_core.train.throughput): a starved run shows here, not in the reward.
    Panel("throughput (tokens/s)", (_line("throughput/gen_tokens_per_s", "generated"),
                                    _line("throughput/train_tokens_per_s", "trained"))),
    Panel("seconds per step", (_line("throughput/gen_seconds", "generation"),
                               _line("throughput/train_seconds", "training"),
                               _line("step_time", "TRL step_time", ":"))),
    # against the GPU's listed peak, or on a CPU this machine's own measured matmul rate
    Panel("MFU (throughput/mfu)", (_line("throughput/mfu"),), share=True),
]
SFT_PANELS = [Panel(k, (_line(k),)) for k in ("loss", "mean_token_accuracy", "grad_norm",
                                              "learning_rate")]


def _series(history: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(history):
        v = row.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        xs.append(float(row.get("step", i + 1)))
        ys.append(float(v))
    return xs, ys


def panels(history: Sequence[dict], kind: str = "grpo",
           keys: Sequence[str] | None = None) -> list[Panel]:
    """The panels to draw, in order, each with only the lines that have a finite point; a
    panel with none is left out (kl when beta = 0), not drawn empty."""
    if keys is not None:
        wanted = [Panel(k, (_line(k),)) for k in keys]
    else:
        wanted = SFT_PANELS if kind == "sft" else GRPO_PANELS
    # TRL logs the functions in reward_funcs order; keep it (first seen) for stable colours.
    funcs = list(dict.fromkeys(m.group(1) for row in history for k in row
                               if (m := _PER_FUNC.fullmatch(k))))
    out = []
    for p in wanted:
        lines = p.lines
        if p.title == "reward per function":
            lines = tuple(_line(f"rewards/{f}/mean", f) for f in funcs)
        lines = tuple(ln for ln in lines if _series(history, ln[0])[0])
        if lines:
            out.append(Panel(p.title, lines, p.band, p.share))
    return out


def figure(history: Sequence[dict], kind: str = "grpo", keys: Sequence[str] | None = None,
           title: str | None = None):
    """The matplotlib Figure (Agg canvas attached): one axis per panel against the step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    todo = panels(history, kind, keys)
    n = max(1, len(todo))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 2.8 * rows), dpi=100)
    FigureCanvasAgg(fig)
    if not todo:  # a round that logged nothing still gets a chart saying so, not a crash
        ax = fig.add_subplot(1, 1, 1)
        ax.set_title("nothing logged", fontsize=9, loc="left")
        ax.text(0.5, 0.5, "no metric was logged", ha="center", va="center",
                transform=ax.transAxes, color="grey")
        ax.set_axis_off()
    for i, p in enumerate(todo):
        ax = fig.add_subplot(rows, cols, i + 1)
        for key, label, style in p.lines:
            xs, ys = _series(history, key)
            if style == "o":
                ax.plot(xs, ys, "o", markersize=5, label=label)
            else:
                ax.plot(xs, ys, linestyle=style, linewidth=1.2 if style == "-" else 0.9,
                        marker="." if len(xs) < 40 and style == "-" else None, label=label)
        if p.band:
            _band(ax, history, *p.band)
        if p.share:
            ax.set_ylim(-0.05, 1.05)
        if len(p.lines) > 1:
            ax.legend(fontsize=7, loc="best")
        ax.set_title(p.title, fontsize=9, loc="left")
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps are whole
        ax.ticklabel_format(axis="y", useOffset=False)  # entropy 5.7735 + 1e-5 is unreadable
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"{kind} training curves ({len(history)} log rows)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # room for the suptitle
    return fig


def _band(ax, history: Sequence[dict], mean_key: str, std_key: str) -> None:
    # Only steps with both values: a missing std must not shift the band against the line.
    means, stds = _series(history, mean_key), dict(zip(*_series(history, std_key)))
    pts = [(x, m, stds[x]) for x, m in zip(*means) if x in stds]
    if pts:
        xs, ms, ss = zip(*pts)
        ax.fill_between(xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)],
                        alpha=0.2, label=std_key)


def save_png(fig, path: str | Path) -> Path:
    """Write a Figure (figure, passrate_figure) as a PNG at path, folders made; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


# ----------------------------------------------------------------------------- pass rates


def passrate_figure(pass_rates: Sequence[float], band: tuple[float, float], bins: int = 8,
                    title: str = "Estimated pass rate per prompt"):
    """The pass-rate histogram (grpo_core.eval.passrate.histogram: one bin per attainable
    rate j/bins) with the kept band shaded, as a Figure (Agg canvas attached)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from grpo_core.eval.passrate import histogram

    h = histogram(pass_rates, bins)
    fig = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.axvspan(band[0], band[1], color="tab:green", alpha=0.15, label=f"band [{band[0]}, {band[1]}]")
    ax.bar(h["centres"], h["counts"], width=0.8 / bins, color="tab:blue", label="prompts")
    ax.set_xlim(-0.5 / bins, 1 + 0.5 / bins)
    ax.set_xlabel("pass rate")
    ax.set_ylabel("prompts")
    # The title on a line of its own, the legend above the axes under it: the legend never
    # hides a bar, and a long title (k, n) never runs into it.
    fig.suptitle(f"{title} (n={len(pass_rates)})", x=0.02, ha="left", fontsize=10)
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- comparison


def comparison_chart(rows: Sequence[dict], path: str | Path) -> Path:
    """Every comparison row (grpo_core.eval.comparison.COMPARE_COLUMNS): per recipe base vs
    final, each stage vs the one before (`<recipe> - sft over base`) and recipe vs recipe
    (`A vs B`: B's final, then A's), with 95% CI error bars and the paired delta with its CI
    written above each pair; the y-axis fitted to the data (a 0-1 axis flattens the small
    differences the table is about). Returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from grpo_core.eval.comparison import ci_text
    from grpo_core.eval.metric_names import ci_cells

    fig = Figure(figsize=(max(5, 1.8 * len(rows)), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [r["recipe"].replace(" vs ", "\nvs ").replace(" - ", "\n") + f"\n{r['benchmark']}"
              for r in rows]
    for offset, (which, colour) in zip((-0.2, 0.2), (("base", "#9aa5b1"), ("final", "#2b6cb0"))):
        _, lo, hi = ci_cells(which)
        means = [r[which] or 0.0 for r in rows]
        err = [[max(0.0, (r[which] or 0) - (r[lo] or 0)) for r in rows],
               [max(0.0, (r[hi] or 0) - (r[which] or 0)) for r in rows]]
        ax.bar([i + offset for i in range(len(rows))], means, width=0.4, yerr=err, capsize=3,
               color=colour, label="base (A vs B: B's final)" if which == "base" else which)
    tops = [max(r["base_hi"] or r["base"] or 0, r["final_hi"] or r["final"] or 0) for r in rows]
    ceiling = min(1.0, max(tops, default=0) * 1.3) or 1.0
    for i, r in enumerate(rows):
        if r["delta"] is not None:
            delta = ci_text(*(r[cell] for cell in ci_cells("delta")), sign="+")
            ax.text(i, tops[i] + 0.03 * ceiling, f"Δ {delta}", ha="center", fontsize=6.5)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel(rows[0]["metric"] if rows else "")
    ax.set_ylim(0, ceiling * 1.08)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title("R1-Zero vs SFT+GRPO, stage by stage (95% bootstrap CI; Δ: paired CI)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
