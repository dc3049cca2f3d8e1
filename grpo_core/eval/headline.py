"""The few numbers a person opens MLflow for, as numbers and text: pure functions over
stage results, paired deltas and comparison rows (tasks/tracking logs what they return).

- `headline_metrics`: a parent run's short-named metrics per benchmark on the primary
  metric: `<bench>/base`, `<bench>/final`, `<bench>/delta` (paired, final minus base),
  each with `_lo` / `_hi` (95% CI), then `grpo_steps`, `sft_steps`, `wall_min`, `findings`.
- `headline_tags`: the same as text tags whose names say the metric, each value with its
  CI and rounded to it ("synthetic avg_at_8 final" = "0.121 [0.089, 0.153]"): MLflow's
  runs table shows tags as columns. `comparison_tags` fills the comparison run's row.
- `final_headline`, `result_line`: the parent's copy of the final evaluation, its result
  in one line.
- `parent_description`, `comparison_description`, `landing_text`: the descriptions.
  MLflow's UI shows a description's first ~150 px and folds the rest behind "Show more":
  the answer comes first, in short lines, the tables after it.

Every number is printed with three decimals (ci_text), or rounded to its CI (ci_phrase).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from grpo_core.eval.attribution import ci_phrase, phases_phrase
from grpo_core.eval.comparison import cell_number, ci_text, row_cell
from grpo_core.eval.metric_names import (
    FINAL_PREFIX,
    HEADLINE,
    ci_block_keys,
    ci_cells,
    eval_metrics,
    sanitize_key,
    shown,
)
from grpo_core.eval.score import Scores, metric_of


def headline_metrics(benchmarks: Sequence[str], metric: str, base: Scores,
                     final: Scores, deltas: Mapping[str, Any], *, grpo_steps: int,
                     sft_steps: int, wall_s: float, findings: int) -> dict[str, float]:
    """`base`/`final`: the two evaluations' scores;
    `deltas`: {bench: {metric: {"delta", "lo", "hi"}}} (the paired deltas). A number that
    does not exist (no base evaluation of a benchmark, an unpaired delta) is left out
    rather than logged as 0."""
    out: dict[str, float] = {}
    for bench in benchmarks:
        b = sanitize_key(bench)
        m_base, m_final = metric_of(base, bench, metric), metric_of(final, bench, metric)
        d = (deltas.get(bench) or {}).get(metric) or {}
        blocks = {"base": (m_base.get("mean"), m_base.get("lo"), m_base.get("hi")),
                  "final": (m_final.get("mean"), m_final.get("lo"), m_final.get("hi")),
                  "delta": (d.get("delta"), d.get("lo"), d.get("hi"))}
        for name, triple in blocks.items():
            for key, x in zip(ci_cells(f"{b}/{name}"), triple, strict=True):
                if x is not None:
                    out[key] = shown(x)
    out.update({"grpo_steps": float(grpo_steps), "sft_steps": float(sft_steps),
                "wall_min": round(wall_s / 60.0, 2), "findings": float(findings)})
    return out


def headline_table(benchmarks: Sequence[str], metric: str, numbers: Mapping[str, float],
                   findings_said: str | None = None) -> str:
    """The headline as a markdown table: base, final and the paired delta per benchmark
    with their CIs, then the run's size."""
    def cell(key: str, sign: str = "") -> str:
        return ci_text(*(numbers.get(c) for c in ci_cells(key)), sign=sign)

    rows = [f"| {bench} | {cell(f'{b}/base')} | {cell(f'{b}/final')} | {cell(f'{b}/delta', '+')} |"
            for bench, b in ((x, sanitize_key(x)) for x in benchmarks)]
    return "\n".join([f"| benchmark ({metric}, 95% CI) | base | final | delta (paired) |",
                      "|---|---|---|---|", *rows, "",
                      f"{numbers['grpo_steps']:.0f} GRPO steps, {numbers['sft_steps']:.0f} SFT "
                      f"steps, {numbers['wall_min']:.1f} min, "
                      f"{findings_said or format(numbers['findings'], '.0f') + ' findings'}. "
                      "Columns of the runs table: `<benchmark>/base`, `/final`, `/delta`."])


def earned_line(attribution: Mapping[str, Any] | None) -> str:
    """"What earned it (synthetic avg@8, paired 95% CI): SFT alone gave ...": one line,
    "" without an attribution."""
    if not attribution or not attribution.get("stages"):
        return ""
    said = phases_phrase(attribution.get("phases") or {})
    return (f"What earned it ({attribution['benchmark']} {attribution['metric']}, paired "
            f"95% CI): {said or 'n/a'}.")


def attribution_table(attribution: Mapping[str, Any] | None) -> str:
    """Each stage's paired gain over the one before, as a markdown table ("" without)."""
    if not attribution or not attribution.get("stages"):
        return ""
    rows = [f"| {g['stage']} | {g['over']} | {ci_phrase(g)} |" for g in attribution["stages"]]
    return "\n".join(["| stage | over | gain |", "|---|---|---|", *rows])


def parent_description(recipe: str, summary: str, attribution: Mapping | None, table: str,
                       prefect_url: str | None = None) -> str:
    """A parent run's description: the result and what earned it in the first two lines
    (above MLflow's fold), then the headline table, the stage table and the Prefect flow
    run that made it (`prefect_url`, a server's page; none under the temporary server)."""
    head = [f"**{recipe}**: {summary}."]
    if earned := earned_line(attribution):
        head.append(f"**{earned}**")
    tail = [attribution_table(attribution), f"Prefect flow run: [{prefect_url}]({prefect_url})"
            if prefect_url else ""]
    return "\n\n".join([*head, table, *filter(None, tail)])


def headline_tag(bench: str, metric: str, col: str) -> str:
    """The tag (a runs-table column) of one headline cell: "synthetic avg_at_8 final";
    the delta says it is paired ("... delta paired")."""
    return sanitize_key(f"{bench} {metric} {col}" + (" paired" if col == "delta" else ""))


def cell_text(value: float | None, lo: float | None, hi: float | None, signed: bool = False) -> str:
    """"0.121 [0.089, 0.153]": a value rounded to the precision its CI supports (the
    verdict's rounding), "" without a value."""
    if value is None:
        return ""
    return ci_phrase({"delta": value, "lo": lo, "hi": hi}, signed=signed)


def headline_tags(benchmarks: Sequence[str], metric: str, numbers: Mapping[str, float]
                  ) -> dict[str, str]:
    """headline_metrics' numbers as text tags with CIs, for the runs table's columns."""
    out = {}
    for bench in benchmarks:
        b = sanitize_key(bench)
        for col in HEADLINE:
            text = cell_text(*(numbers.get(k) for k in ci_cells(f"{b}/{col}")),
                             signed=col == "delta")
            if text:
                out[headline_tag(bench, metric, col)] = text
    return out


def comparison_tags(rows: Iterable[Mapping]) -> dict[str, str]:
    """The comparison run's row of the runs table: the paired delta of each
    recipe-vs-recipe row ("A vs B"), naming both recipes ("sft_grpo - r1_zero +0.080
    [0.047, 0.113]"). Its base and final columns stay empty: in every other row they hold
    a base model's and a final model's number, and one column has one meaning. `rows`:
    COMPARE_COLUMNS rows, numbers or CSV strings."""
    out = {}
    for r in rows:
        a, vs, b = str(r["recipe"]).partition(" vs ")
        if not vs or " - " in a:
            continue
        delta = cell_text(*(cell_number(r.get(k)) for k in ci_cells("delta")), signed=True)
        if delta:
            out[headline_tag(r["benchmark"], r["metric"], "delta")] = f"{a} - {b} {delta}"
    return out


def comparison_lines(rows: Iterable[Mapping]) -> list[str]:
    """One short line per recipe: "r1_zero: 0.121 [0.089, 0.153], +0.067 [0.044, 0.094]
    over the base (synthetic avg@8)"."""
    return [f"{r['recipe']}: {row_cell(r, 'final')}, {row_cell(r, 'delta', '+')} over the base "
            f"({r['benchmark']} {r['metric']})"
            for r in rows if " vs " not in str(r["recipe"]) and " - " not in str(r["recipe"])]


def comparison_description(said: str, rows: Iterable[Mapping], markdown: str, links: str) -> str:
    """The comparison run's description: the verdict, each recipe's final in a short line,
    then the table and the links to the parent runs."""
    lines = [f"**{said}**" if said else "", *(f"- {x}" for x in comparison_lines(rows))]
    return "\n".join([*filter(None, lines), "", markdown, "", links])


def final_headline(benchmarks: Scores, primary: str) -> dict[str, float]:
    """The parent run's copy of the final evaluation: the primary metric's block per
    benchmark (final/<bench>/<metric>, _ci_lo, _ci_hi, _n). Every other metric stays on
    the eval/final run: a parent holding all of them buries the headline in its list."""
    keep = {FINAL_PREFIX + k for b in benchmarks
            for k in ci_block_keys(f"{sanitize_key(str(b))}/{sanitize_key(primary)}").values()}
    return {FINAL_PREFIX + k: shown(v) for k, v in eval_metrics(benchmarks).items()
            if FINAL_PREFIX + k in keep}


def result_line(bench: str | None, metric: str, block: Mapping[str, Any],
                registered: tuple[str, str, bool, str] | None = None,
                delta: Mapping[str, Any] | None = None, over: str = "the base") -> str:
    """A pipeline's result in one line, "synthetic avg_at_8 0.121 [0.089, 0.153], +0.067
    [0.044, 0.094] over the base (paired); m v2 champion (reason)"; `block`: the primary
    metric's {"mean", "lo", "hi"} on the first benchmark; `delta`: its paired delta
    ({"delta", "lo", "hi"}) over `over`; `registered`: (model, version, promoted, reason)."""
    said = (f"{bench} {metric} {ci_text(block['mean'], block.get('lo'), block.get('hi'))}"
            if block.get("mean") is not None else f"{bench} {metric}: n/a")
    if delta and delta.get("delta") is not None:
        said += f", {ci_phrase(delta)} over {over} (paired)"
    if registered:
        name, version, promoted, reason = registered
        said += f"; {name} v{version} {'champion' if promoted else 'challenger'} ({reason})"
    return said


def landing_text(said: str, comparison: str, parents: str, table: str, view: str,
                 prefect: str = "") -> str:
    """The experiment's description after a comparison: plain text first (MLflow's
    experiment list shows its start unrendered), then the links (markdown)."""
    return "\n".join([f"Verdict: {said}" if said else "Recipe comparison", "",
                      f"- [comparison run]({comparison}): the table, stage by stage, and the chart",
                      f"- parent runs: {parents}",
                      f"- [headline runs table]({table}) (base, final and paired delta per recipe; "
                      f"also the runs table's Views menu: \"{view}\")",
                      *([f"- {prefect}"] if prefect else [])])
