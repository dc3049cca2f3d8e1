"""The few numbers a person opens MLflow for, where the UI shows them without a guide.

- `headline_metrics`: the parent run's short-named metrics, per benchmark of the config
  and on its primary metric: `<bench>/base`, `<bench>/final`, `<bench>/delta` (paired,
  final minus base), each with `_lo` / `_hi` (95% CI), then `grpo_steps`, `sft_steps`,
  `wall_min` and `findings` (how many).
- `headline_tags`: the same numbers as text tags whose names say the metric, each value
  with its CI and rounded to it ("synthetic avg_at_8 final" = "0.121 [0.089, 0.153]"):
  MLflow's runs table shows tags as columns, so the table reads like the report (a metric
  column shows the raw float and no CI). `comparison_tags` fills the comparison run's
  row under the same names, recipe against recipe, each cell naming its recipe.
- `set_experiment_view`: the experiment is tagged as model development (MLflow's
  `mlflow.experimentKind`) and given a saved runs-table view whose columns are the
  headline tags, first. MLflow 3.17 keeps a runs-table view as the experiment tag
  `mlflow.sharedViewState.<id>`; a value in its saved-view envelope ({"name",
  "createdAt", "updatedAt", "state": the view as a JSON string}, the web app's
  `experiment-page` saved views) is listed under the runs table's "Views" menu by its
  name, and opens through `?viewStateShareKey=<id>` too (a bare state only through the
  link). The link `grpo run` prints asks for MLflow's model-training mode
  (`?workflowType=machine_learning`: MLflow 3.17 ignores the kind tag and opens every
  experiment in its GenAI view).
- `ui_links`: the UI addresses of the runs table, a run and a model version.

No Prefect import; the MLflow client comes from the caller."""
from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mlflow.tracking import MlflowClient

from grpo_core.eval.attribution import ci_phrase, phases_phrase
from grpo_core.eval.metric_names import HEADLINE, ci_cells, shown
from tasks.tracking.comparison import cell_number, ci_text
from tasks.tracking.mlflow_client import current_uri, get_client, sanitize_key, set_tags
from tasks.tracking.tracking_store import strip_userinfo

EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"
VIEW_KEY = "grpo-headline"
VIEW_NAME = "Headline: base, final, paired delta (95% CI)"  # as the Views menu lists it
# MLflow 3.17's UI starts in its GenAI mode whatever the experiment's kind tag says (the
# mode is a browser-wide switch, remembered in local storage): links ask for the model
# training mode explicitly. Checked in Chromium (bench/mlflow_ui_check.py).
WORKFLOW = "machine_learning"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
DEFAULT_UI = "http://127.0.0.1:5000"  # `mlflow ui`'s default address, for a local store
_STATS = ("grpo_steps", "sft_steps", "wall_min", "findings")
CELL_PX, DELTA_PX = 210, 300  # runs-table widths of a headline cell, of the delta cell


def headline_metrics(benchmarks: Sequence[str], metric: str, base: Mapping[str, Any],
                     final: Mapping[str, Any], deltas: Mapping[str, Any], *, grpo_steps: int,
                     sft_steps: int, wall_s: float, findings: int) -> dict[str, float]:
    """`base`/`final`: {bench: {"metrics": {metric: {"mean", "lo", "hi"}}}} (stage results);
    `deltas`: {bench: {metric: {"delta", "lo", "hi"}}} (finish_pipeline's paired deltas).
    A number that does not exist (no base evaluation of a benchmark, an unpaired delta) is
    left out rather than logged as 0."""
    out: dict[str, float] = {}
    for bench in benchmarks:
        b = sanitize_key(bench)
        blocks = {"base": _block(base, bench, metric), "final": _block(final, bench, metric),
                  "delta": _delta(deltas, bench, metric)}
        for name, triple in blocks.items():
            for key, x in zip(ci_cells(f"{b}/{name}"), triple, strict=True):
                if x is not None:
                    out[key] = shown(x)
    out.update({"grpo_steps": float(grpo_steps), "sft_steps": float(sft_steps),
                "wall_min": round(wall_s / 60.0, 2), "findings": float(findings)})
    return out


def headline_table(benchmarks: Sequence[str], metric: str, numbers: Mapping[str, float],
                   findings_said: str | None = None) -> str:
    """The headline as a markdown table (a parent run's description, at the top of its
    page): base, final and the paired delta per benchmark with their CIs, then the size."""
    def cell(key: str, sign: str = "") -> str:
        return ci_text(*(numbers.get(cell) for cell in ci_cells(key)), sign=sign)

    rows = [f"| {bench} | {cell(f'{b}/base')} | {cell(f'{b}/final')} | {cell(f'{b}/delta', '+')} |"
            for bench, b in ((x, sanitize_key(x)) for x in benchmarks)]
    return "\n".join([f"| benchmark ({metric}, 95% CI) | base | final | delta (paired) |",
                      "|---|---|---|---|", *rows, "",
                      f"{numbers['grpo_steps']:.0f} GRPO steps, {numbers['sft_steps']:.0f} SFT "
                      f"steps, {numbers['wall_min']:.1f} min, "
                      f"{findings_said or format(numbers['findings'], '.0f') + ' findings'}. "
                      "Columns of the runs table: `<benchmark>/base`, `/final`, `/delta`."])


def attribution_text(attribution: Mapping[str, Any] | None) -> str:
    """The stage attribution (tasks.tracking.comparison.stage_attribution) as markdown for
    a description: the phases in one line, then each stage's paired gain over the one
    before; "" without one."""
    if not attribution or not attribution.get("stages"):
        return ""
    rows = [f"| {g['stage']} | {g['over']} | {ci_phrase(g)} |" for g in attribution["stages"]]
    said = phases_phrase(attribution.get("phases") or {})
    return "\n".join(["", "", f"**What earned it** ({attribution['benchmark']} "
                       f"{attribution['metric']}, paired 95% CI): {said or 'n/a'}.", "",
                       "| stage | over | gain |", "|---|---|---|", *rows])


def _block(results: Mapping[str, Any], bench: str, metric: str) -> tuple:
    m = ((results.get(bench) or {}).get("metrics") or {}).get(metric) or {}
    return m.get("mean"), m.get("lo"), m.get("hi")


def _delta(deltas: Mapping[str, Any], bench: str, metric: str) -> tuple:
    d = (deltas.get(bench) or {}).get(metric) or {}
    return d.get("delta"), d.get("lo"), d.get("hi")


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
    """The comparison run's row of the runs table: for each recipe-vs-recipe row ("A vs
    B", whose base is B's final and final A's), base and final name their recipe and the
    paired delta names both ("sft_grpo - r1_zero +0.080 [0.047, 0.113]"). `rows`:
    COMPARE_COLUMNS rows, numbers or CSV strings."""
    out = {}
    for r in rows:
        a, vs, b = str(r["recipe"]).partition(" vs ")
        if not vs or " - " in a:
            continue
        cells = {col: cell_text(*(cell_number(r.get(k)) for k in ci_cells(col)), signed=col == "delta")
                 for col in HEADLINE}
        said = {"base": f"{b} {cells['base']}", "final": f"{a} {cells['final']}",
                "delta": f"{a} - {b} {cells['delta']}"}
        out.update({headline_tag(r["benchmark"], r["metric"], col): said[col]
                    for col in HEADLINE if cells[col]})
    return out


def headline_columns(benchmarks: Iterable[str], metric: str) -> list[str]:
    """The runs table's columns for the headline (MLflow ids "tags.`<name>`"): base,
    final and paired delta per benchmark, each with its CI, then the run's size."""
    cols = ["attributes.`Models`"]
    for bench in benchmarks:
        cols += [f"tags.`{headline_tag(bench, metric, name)}`" for name in HEADLINE]
    return cols + [f"metrics.`{s}`" for s in _STATS]


def saved_view(state: Mapping[str, Any], name: str, created_ms: int | None = None) -> str:
    """A runs-table view as MLflow 3.17's web app saves one (listed under "Views")."""
    now = int(time.time() * 1000)
    return json.dumps({"name": name, "createdAt": created_ms or now, "updatedAt": now,
                       "state": json.dumps(state)})


def read_view(value: str | None) -> tuple[dict, int | None]:
    """(the view's state, when it was created) of a `mlflow.sharedViewState.*` tag, in
    the saved-view envelope or bare (as earlier versions of this pipeline wrote it)."""
    try:
        found = json.loads(value) if value else {}
        if isinstance(found.get("state"), str):
            return json.loads(found["state"]), found.get("createdAt")
        return found, None
    except (ValueError, AttributeError):
        return {}, None


def set_experiment_view(client: MlflowClient, exp_id: str, benchmarks: Iterable[str],
                        metric: str) -> str:
    """Tag the experiment as model development and save the headline runs-table view
    (columns of earlier configs' benchmarks are kept: one experiment, one table).
    Returns the view key for `ui_links`."""
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    tag = VIEW_TAG_PREFIX + VIEW_KEY
    old, created = read_view(client.get_experiment(exp_id).tags.get(tag))
    # metric columns of an earlier version's view gave way to the tags
    kept = [c for c in old.get("selectedColumns", []) if c.startswith("tags.")]
    cols = list(dict.fromkeys([*kept, *headline_columns(benchmarks, metric)]))
    stats = [f"metrics.`{s}`" for s in _STATS]  # the run's size after every benchmark
    cols = ["attributes.`Models`", *(c for c in cols if c not in (*stats, "attributes.`Models`")),
            *stats]
    view = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
            "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs",
            "datasetsFilter": [], "selectedColumns": cols, "columnOrder": cols,
            # MLflow's default column (~90 px) cuts "0.054 [0.035, 0.072]" to "0.054 [0.03...":
            # wide enough for a value with its CI, and the comparison's recipe names
            "columnWidths": {c: DELTA_PX if c.endswith(" paired`") else CELL_PX
                             for c in cols if c.startswith("tags.")}}
    client.set_experiment_tag(exp_id, tag, saved_view(view, VIEW_NAME, created))
    return VIEW_KEY


def ui_base(tracking_uri: str) -> str:
    """Where the MLflow UI of `tracking_uri` is: the server itself for http(s) stores
    (credentials stripped), else $GRPO_MLFLOW_UI_URL (the `mlflow ui` serving the local
    store), else `mlflow ui`'s default local address."""
    if tracking_uri.startswith(("http://", "https://")):
        return strip_userinfo(tracking_uri).rstrip("/")
    return os.environ.get("GRPO_MLFLOW_UI_URL") or DEFAULT_UI


def ui_links(tracking_uri: str, exp_id: str, run_id: str | None = None,
             model: tuple[str, str] | None = None, base: str | None = None) -> dict[str, str]:
    """{"runs_table": ..., "run": ..., "model_version": ...} (the last two when asked);
    `base`: the UI's address when not ui_base's (an `mlflow ui` on another port)."""
    base, ml = (base or ui_base(tracking_uri)).rstrip("/"), f"workflowType={WORKFLOW}"
    links = {"runs_table": f"{base}/#/experiments/{exp_id}/runs?{ml}&viewStateShareKey={VIEW_KEY}"}
    if run_id:
        links["run"] = f"{base}/#/experiments/{exp_id}/runs/{run_id}?{ml}"
    if model:
        name, version = model
        links["model_version"] = (f"{base}/#/models/{urllib.parse.quote(name)}/versions/"
                                  f"{version}?{ml}")
    return links


def links_for_run(run_id: str, model: tuple[str, str] | None = None,
                  client: MlflowClient | None = None) -> dict[str, str]:
    """ui_links of `run_id` in this process's store (tasks.tracking.mlflow_client.connect)."""
    exp_id = get_client(client).get_run(run_id).info.experiment_id
    return ui_links(current_uri(), exp_id, run_id, model)


VERDICT_TAG = "grpo.verdict"


def describe_comparison(run_id: str, said: str, markdown: str, parent_runs: Sequence[str],
                        prefect_run: Mapping[str, str | None] | None = None,
                        client: MlflowClient | None = None) -> None:
    """The answer where a newcomer lands: the comparison run's description (shown at the
    top of its page) and the experiment's (`mlflow.note.content`, its landing text) start
    with the verdict sentence, then link the comparison run, the parent runs, the saved
    headline view and the Prefect flow run. Links are relative to the UI's address (the
    same whichever host or port serves it)."""
    c = get_client(client)
    run = c.get_run(run_id)
    exp_id = run.info.experiment_id

    def link(rid: str) -> str:
        return ui_links("", exp_id, rid, base="/")["run"]

    parents = ", ".join(f"[{c.get_run(p).info.run_name}]({link(p)})" for p in parent_runs)
    prefect = prefect_run or {}
    prefect_link = (f"[Prefect flow run]({prefect['url']})" if prefect.get("url")
                    else f"Prefect flow run `{prefect['id']}`" if prefect.get("id") else "")
    lines = [f"**{said}**" if said else "", "",
             f"Parent runs: {parents}" + (f"; {prefect_link}" if prefect_link else "") + ".", ""]
    set_tags(run_id, {"mlflow.note.content": "\n".join([*lines, markdown]),
                      VERDICT_TAG: said or "none",
                      **({"prefect_flow_run_id": prefect["id"]} if prefect.get("id") else {})}, c)
    table = ui_links("", exp_id, base="/")["runs_table"]
    # Plain text first: MLflow's experiment list shows the description's start unrendered.
    landing = [f"Verdict: {said}" if said else "Recipe comparison", "",
               f"- [comparison run]({link(run_id)}): the table, stage by stage, and the chart",
               f"- parent runs: {parents}",
               f"- [headline runs table]({table}) (base, final and paired delta per recipe; "
               f"also the runs table's Views menu: \"{VIEW_NAME}\")",
               *([f"- {prefect_link}"] if prefect_link else [])]
    c.set_experiment_tag(exp_id, "mlflow.note.content", "\n".join(landing))


def comparison_verdict(uri: str | None, experiment: str) -> str | None:
    """The verdict of `experiment`'s newest comparison run (None without one)."""
    client = MlflowClient(tracking_uri=uri, registry_uri=uri) if uri else get_client()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], "tags.`grpo.pipeline` = 'comparison'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    said = found[0].data.tags.get(VERDICT_TAG) if found else None
    if said in (None, "none"):
        return None
    from tasks.tracking.verdict_freshness import annotate  # what it was computed with, STALE

    return annotate(said, found[0], client)
