"""PNG charts of a training run, drawn on the Agg canvas directly (no pyplot): no display
needed, no global backend switched under a notebook that imported us, thread-safe."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

# What each stage's curves show, in panel order. A key the trainer never logged (kl when
# beta = 0) gets an empty panel that says so rather than disappearing silently.
CURVES = {
    "grpo": ["reward", "reward_std", "kl", "completions/mean_length", "frac_reward_zero_std"],
    "sft": ["loss", "mean_token_accuracy", "grad_norm", "learning_rate"],
}


def _series(history: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(history):
        v = row.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        xs.append(float(row.get("step", i + 1)))
        ys.append(float(v))
    return xs, ys


def training_curves(history: Sequence[dict], path: str | Path, kind: str = "grpo",
                    keys: Sequence[str] | None = None, title: str | None = None) -> Path:
    """One subplot per metric key against the optimizer step; returns the PNG path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(keys or CURVES.get(kind, CURVES["grpo"]))
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(4.2 * cols, 2.8 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        xs, ys = _series(history, key)
        if xs:
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, linewidth=1.2)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
        ax.set_title(key, fontsize=9, loc="left")
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"{kind} training curves ({len(history)} log rows)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
