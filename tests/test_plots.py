"""tasks.plots: which panels the training-curve PNG shows, in which order, and what each
draws. The history rows carry the keys a real 2-step TRL 1.16 GRPO round logged (three
reward functions, in-round eval on)."""
from __future__ import annotations

import math

from PIL import Image

from tasks.plots import figure, panels, passrate_figure, save_png

LEAD = ["reward (mean +- std)", "reward per function", "accuracy", "completion length (tokens)",
        "truncated at max length (completions/clipped_ratio)",
        "groups with zero reward std (frac_reward_zero_std)"]


def _grpo_row(step: int, kl: bool = True, in_round: bool = False) -> dict:
    row = {"loss": 1e-6 * step, "grad_norm": 0.5, "learning_rate": 1e-3 / step, "num_tokens": 1600.0 * step,
           "completions/mean_length": 7.5, "completions/min_length": 6.0, "completions/max_length": 8.0,
           "completions/clipped_ratio": 0.9, "completions/mean_terminated_length": 6.0,
           "rewards/accuracy/mean": 0.1 * step, "rewards/accuracy/std": 0.2,
           "rewards/format/mean": -0.5, "rewards/format/std": 0.0,
           "rewards/tag_count/mean": 0.25, "rewards/tag_count/std": 0.09,
           "reward": -0.4 + 0.1 * step, "reward_std": 0.05, "frac_reward_zero_std": 0.5,
           "entropy": 5.77, "clip_ratio/region_mean": 0.0, "step_time": 0.2, "epoch": 0.1 * step,
           "step": step, "beta": 0.04,
           "throughput/gen_seconds": 0.15, "throughput/train_seconds": 0.05,
           "throughput/gen_tokens_per_s": 400.0, "throughput/train_tokens_per_s": 1200.0}
    if kl:
        row["kl"] = 1e-5 * step
    if in_round:
        row["in_round_eval/accuracy"] = 0.25
    return row


def _titles(fig) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def test_grpo_panels_lead_with_reward_functions_accuracy_length_truncation_zero_std():
    hist = [_grpo_row(s, in_round=s % 2 == 0) for s in range(1, 5)]
    titles = [p.title for p in panels(hist)]
    assert titles[:6] == LEAD
    assert titles[6:] == ["kl", "entropy", "clip_ratio/region_mean", "loss", "grad_norm",
                          "learning_rate", "throughput (tokens/s)", "seconds per step"]
    fig = figure(hist)
    assert _titles(fig) == titles  # the drawn figure is what panels() planned
    reward_ax = fig.axes[0]
    assert len(reward_ax.lines) == 1 and reward_ax.collections  # reward line + std band
    length_ax = fig.axes[3]
    assert [ln.get_label() for ln in length_ax.lines] == ["mean", "min", "max"]
    speed_ax = fig.axes[titles.index("seconds per step")]  # no MFU panel on CPU
    assert [ln.get_label() for ln in speed_ax.lines] == ["generation", "training", "TRL step_time"]


def test_per_function_panel_has_one_line_per_reward_function_in_trl_order():
    hist = [_grpo_row(s) for s in range(1, 4)]
    hist[2]["rewards/soft_overlong/mean"] = -0.1  # a function first logged later still shows
    fig = figure(hist)
    ax = fig.axes[_titles(fig).index("reward per function")]
    assert [ln.get_label() for ln in ax.lines] == ["accuracy", "format", "tag_count", "soft_overlong"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "accuracy", "format", "tag_count", "soft_overlong"]
    assert list(ax.lines[0].get_ydata()) == [0.1, 0.2, 0.1 * 3]


def test_accuracy_panel_marks_in_round_eval_points_only_where_logged():
    hist = [_grpo_row(s, in_round=s in (2, 4)) for s in range(1, 5)]
    ax = figure(hist).axes[2]
    train, held_out = ax.lines
    assert train.get_label() == "train samples" and list(train.get_xdata()) == [1, 2, 3, 4]
    assert held_out.get_label() == "in-round eval" and held_out.get_linestyle() == "None"
    assert list(held_out.get_xdata()) == [2, 4]
    assert ax.get_ylim() == (-0.05, 1.05)  # a share: fixed axis
    # No in-round eval: the panel keeps the training-sample accuracy alone.
    only = [p for p in panels([_grpo_row(1)]) if p.title == "accuracy"][0]
    assert [k for k, _, _ in only.lines] == ["rewards/accuracy/mean"]


def test_metrics_never_logged_or_never_finite_get_no_panel():
    no_kl = [_grpo_row(s, kl=False) for s in range(1, 4)]  # beta = 0: TRL never logs kl
    assert "kl" not in [p.title for p in panels(no_kl)]
    nan_kl = [{**_grpo_row(s), "kl": v} for s, v in ((1, math.nan), (2, None), (3, math.inf))]
    assert "kl" not in _titles(figure(nan_kl))
    # Only the total reward logged (an older history): one panel, grid of one.
    fig = figure([{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}])
    assert _titles(fig) == [LEAD[0]] and len(fig.axes) == 1
    # Without accuracy among the reward functions, no accuracy panel.
    hist = [{k: v for k, v in _grpo_row(s).items() if not k.startswith("rewards/accuracy")}
            for s in (1, 2)]
    assert "accuracy" not in [p.title for p in panels(hist)]


def test_empty_history_writes_a_valid_png_saying_so(tmp_path):
    for hist in ([], [{"step": 1, "kl": math.nan, "note": "x", "flag": True}]):
        assert panels(hist) == []
        fig = figure(hist)
        assert _titles(fig) == ["nothing logged"]
        png = save_png(figure(hist), tmp_path / "sub" / "empty.png")
        with Image.open(png) as im:
            im.verify()
            assert im.format == "PNG"


def test_grpo_png_is_a_valid_image_sized_to_the_grid(tmp_path):
    hist = [_grpo_row(s, in_round=True) for s in range(1, 6)]
    png = save_png(figure(hist, kind="grpo"), tmp_path / "grpo_curves.png")
    with Image.open(png) as im:
        assert im.format == "PNG"
        assert im.size == (3 * 420, 5 * 280)  # 14 panels, 3 columns, 100 dpi
    few = save_png(figure([{"step": 1, "reward": 0.1, "kl": 0.0}]), tmp_path / "few.png")
    with Image.open(few) as im:
        assert im.size == (2 * 420, 280)


def test_sft_curves_keep_their_panels_and_leave_out_missing(tmp_path):
    hist = [{"step": s, "loss": 2.0 / s, "mean_token_accuracy": 0.1 * s, "grad_norm": 1.0,
             "learning_rate": 1e-4} for s in range(1, 4)]
    assert [p.title for p in panels(hist, "sft")] == ["loss", "mean_token_accuracy", "grad_norm",
                                                      "learning_rate"]
    no_acc = [{k: v for k, v in row.items() if k != "mean_token_accuracy"} for row in hist]
    assert _titles(figure(no_acc, "sft")) == ["loss", "grad_norm", "learning_rate"]
    with Image.open(save_png(figure(hist, kind="sft"), tmp_path / "sft_curves.png")) as im:
        assert im.format == "PNG"


def test_explicit_keys_draw_those_panels_only():
    hist = [_grpo_row(s) for s in (1, 2)]
    assert [p.title for p in panels(hist, keys=["kl", "missing", "reward"])] == ["kl", "reward"]


def test_passrate_histogram_writes_a_png(tmp_path):
    path = save_png(passrate_figure([0.0, 0.25, 0.5, 0.5, 1.0], (0.3, 0.7), bins=4),
                    tmp_path / "sub" / "h.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_passrate_histogram_title_and_legend_do_not_overlap():
    """The filter's title carries k and n; it once ran into the legend above the axes."""
    fig = passrate_figure([0.0] * 300 + [0.125] * 50, (0.125, 0.875),
                          title="Estimated pass rate per prompt (k=8)")
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)  # noqa: SLF001 - matplotlib's own handle
    legend = fig.axes[0].get_legend().get_window_extent(renderer)
    assert "n=350" in fig._suptitle.get_text() and not title.overlaps(legend)



def test_grpo_filter_plot_writes_the_histogram_png(tmp_path):
    """`grpo filter --plot`: the built-in model's pass rates drawn as a PNG, folders made."""
    from typer.testing import CliRunner

    from flows.cli import app

    png = tmp_path / "sub" / "h.png"
    res = CliRunner().invoke(app, ["filter", "--source", "synthetic:arith", "--limit", "6",
                                   "--k", "2", "--workdir", str(tmp_path / "ws"),
                                   "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert f"histogram plot: {png}" in res.output.replace("\n", "")
    with Image.open(png) as im:
        assert im.format == "PNG"
