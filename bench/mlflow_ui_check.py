"""Look at a finished workspace the way a user does: in MLflow's UI, in a real browser.

    python bench/mlflow_ui_check.py --workdir .grpo [--out reports/ui]

Starts `mlflow ui` on the workspace's store (loopback, a free port), opens in headless
Chromium the experiment as a new user lands on it, the runs-table link `grpo run` prints,
each recipe's parent run, the comparison run and the champion model versions; saves a
screenshot of each page and checks that the headline metric names and values (read back
through MLflow's API) are on the pages. Prints one line per page and check; exit 1 if a
check failed.

With `--prefect-ui URL` (a Prefect server's UI, e.g. http://127.0.0.1:4200, for runs a
deployment made: README path 2): each parent run's link to its Prefect flow run, that
page named as the MLflow run, and each flow run's artifact page holding the result (the
retrain's decision) and a link back to its MLflow run. `--experiment quickstart` checks the
quickstart's experiment; the comparison checks are skipped where it has no comparison.

Needs the optional `ui` extra (Playwright, `pip install -e '.[ui]'`) and a Chromium:
the Debian package (`apt-get install chromium`) is used when present, so nothing is
downloaded from Playwright's CDN.
"""
from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from harness import ROOT

from grpo_core.eval.headline import headline_tag
from grpo_core.eval.metric_names import HEADLINE, benchmarks_in
from grpo_core.eval.ui_views import VIEW_NAME, ui_links

ASSISTANT_CLOSED = ("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
                    "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")
SETTLE_S = 6.0  # the single-page app fetches after load; charts and tables render late


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(db: Path, port: int, log: Path):
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    with log.open("w") as fh:
        proc = subprocess.Popen([str(mlflow_bin), "ui", "--backend-store-uri", f"sqlite:///{db}",
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow ui exited: {log.read_text()[-2000:]}")
            time.sleep(1)
        else:
            raise RuntimeError("mlflow ui did not answer within 180 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def chromium() -> str | None:
    """The system Chromium, else None (Playwright's own browser, if installed)."""
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)


def shown(value: float) -> list[str]:
    """How the UI may print a metric value (it shows the logged float, sometimes rounded)."""
    forms = {repr(value), f"{value:g}", f"{value:.4g}", f"{value:.3g}", f"{value:.2f}",
             f"{value:.3f}", f"{value:.4f}"}
    if value == int(value):
        forms.add(str(int(value)))
    return sorted(forms)


class Checker:
    def __init__(self, page, out: Path):
        self.page, self.out, self.failed, self.n = page, out, 0, 0

    def visit(self, name: str, url: str, wait_for: str | None = None,
              rows: Sequence[str] = ()) -> str:
        """Open `url`, wait for `wait_for`, then for every text of `rows` (a table's cells:
        the runs table fetches its rows, then their tags, after the page has drawn), each
        up to 60 s, then a short settle for the charts; screenshot; the page's text."""
        self.page.goto(url)
        if wait_for:
            with contextlib.suppress(Exception):
                self.page.get_by_text(wait_for, exact=False).first.wait_for(timeout=30_000)
        self.wait_rows(rows)
        time.sleep(SETTLE_S)
        return self.shoot(name)

    def wait_rows(self, rows: Sequence[str]) -> None:
        for text in rows:
            with contextlib.suppress(Exception):
                self.page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)

    def shoot(self, name: str) -> str:
        self.n += 1
        shot = self.out / f"{self.n:02d}-{name}.png"
        self.page.screenshot(path=str(shot), full_page=True)
        print(f"[page] {name}: {self.page.url}\n       screenshot {shot}")
        return self.page.inner_text("body")

    def check(self, what: str, ok: bool) -> None:
        self.failed += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")


def readable(page, said: str | None) -> bool:
    """The verdict's opening words on screen in an element that is visible and not cut
    off (an ellipsis cell of a table holds the whole text but shows its start only)."""
    if not said:
        return False
    with contextlib.suppress(Exception):
        el = page.get_by_text(" ".join(said.split()[:8]), exact=False).first
        el.wait_for(timeout=10_000)
        return el.is_visible() and el.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
    return False


def not_cut(page, text: str) -> bool:
    """`text` on screen whole: neither its element nor any box up to its table cell cuts
    it off (the runs table ellipsises what its column width does not hold)."""
    with contextlib.suppress(Exception):
        el = page.get_by_text(text, exact=True).first
        return el.is_visible() and el.evaluate(
            """e => { for (let x = e; x; x = x.parentElement) {
                          if (x.scrollWidth > x.clientWidth + 1) return false;
                          if (x.classList.contains('ag-cell')) return true; }
                      return true; }""")
    return False


def check_views_menu(c: Checker, runs_url: str, filled: Sequence[str]) -> None:
    """The headline view found without a link: the runs table's "Views" menu (no share
    key in the address) lists it by name, and choosing it shows the headline columns."""
    page = c.page
    page.goto(runs_url)
    listed = shown_cols = False
    with contextlib.suppress(Exception):
        page.get_by_test_id("saved-views-trigger").first.click(timeout=30_000)
        item = page.get_by_text(VIEW_NAME, exact=True).first
        item.wait_for(timeout=15_000)
        listed = item.is_visible()
        c.shoot("views-menu")
        item.click(timeout=10_000)
        c.wait_rows(filled[:1])
        shown_cols = bool(filled) and filled[0] in page.inner_text("body")
    c.check(f"runs table's Views menu lists {VIEW_NAME!r}", listed)
    c.shoot("views-menu-chosen")
    c.check(f"choosing it shows the headline cells (url {page.url.split('#')[-1][:90]})",
            shown_cols and "viewStateShareKey=" in page.url)


def check_issue27(c: Checker, browser, base: str, exp, client, parents: dict, comps: list,
                  said: str | None, link) -> None:
    """Issue 27's acceptance: the verdict within two clicks of the bare server address and
    above the fold of the comparison run at 1440x900; parents with <= 30 metrics; a GRPO
    round's charts opening on reward or accuracy; one findings count per page."""
    c.check(f"the comparison run has a verdict: {said!r}", bool(said))
    page = c.page
    c.visit("bare-address", f"{base}/")
    clicks, seen = [], readable(page, said)
    for target in (exp.name, "Model training", "Description"):
        if seen or len(clicks) == 2:
            break
        with contextlib.suppress(Exception):
            page.get_by_text(target, exact=True).first.click(timeout=5_000)
            time.sleep(SETTLE_S)
            clicks.append(target)
            seen = readable(page, said)
    c.n += 1
    page.screenshot(path=str(c.out / f"{c.n:02d}-after-clicks.png"), full_page=False)
    print(f"  [info] clicks from the bare address: {clicks} -> {page.url}")
    c.check(f"verdict readable (not cut) within two clicks of the bare address ({len(clicks)} "
            "clicks)", seen)

    small = browser.new_context(viewport={"width": 1440, "height": 900})
    small.add_init_script(ASSISTANT_CLOSED)
    fold = small.new_page()
    for comp in comps[:1]:
        fold.goto(link(comp.info.run_id)["run"])
        box = None
        with contextlib.suppress(Exception):
            el = fold.get_by_text(" ".join(said.split()[:6]), exact=False).first
            el.wait_for(timeout=30_000)
            time.sleep(SETTLE_S)
            box = el.bounding_box() if el.is_visible() else None
        c.n += 1
        shot = c.out / f"{c.n:02d}-comparison-1440x900.png"
        fold.screenshot(path=str(shot), full_page=False)
        print(f"[page] comparison at 1440x900, first screen only\n       screenshot {shot}")
        c.check(f"comparison run: verdict above the fold at 1440x900 (box {box})",
                box is not None and box["y"] + box["height"] <= 900)
    small.close()

    for recipe, p in parents.items():
        n = len(client.get_run(p.info.run_id).data.metrics)
        c.check(f"{recipe} parent: {n} metrics (<= 30)", n <= 30)
        text = c.visit(f"parent-{recipe}-findings", link(p.info.run_id)["run"], wait_for="Metrics")
        count = p.data.tags.get("findings.count")
        c.check(f"{recipe} parent page says the findings count {count!r}",
                bool(count) and count in text)
        for kid in client.search_runs([exp.experiment_id],
                                      f"tags.`mlflow.parentRunId` = '{p.info.run_id}'"):
            if not kid.data.tags.get("grpo.stage", "").startswith("grpo/"):
                continue
            stage = kid.data.tags["grpo.stage"]
            count = kid.data.tags.get("findings.count")
            text = c.visit(f"round-{recipe}-{stage.replace('/', '-')}", link(kid.info.run_id)["run"],
                           wait_for="Diagnosis")
            c.check(f"{recipe} {stage}: its description says the findings count {count!r} "
                    f"(tags: findings={kid.data.tags.get('findings', '')[:60]!r})",
                    bool(count) and f"Diagnosis of this round: {count}" in " ".join(text.split()))
            charts = link(kid.info.run_id)["run"].replace("?", "/model-metrics?", 1)
            text = c.visit(f"round-{recipe}-charts", charts, wait_for="reward")
            # a chart's title is the last part of its metric's name, on a line of its own
            short = {k.rsplit("/", 1)[-1] for k in kid.data.metrics}
            first = next((x.strip() for x in text.splitlines() if x.strip() in short), None)
            c.check(f"{recipe} {stage}: the charts open on reward or accuracy (first: {first})",
                    first in ("reward", "rewards/accuracy/mean", "accuracy"))


def check_prefect(c: Checker, prefect_ui: str, parents: dict, link) -> None:
    """The deployed runs, both ways: MLflow parent -> its Prefect flow run (tag and the
    description's link), and the flow run's artifact -> the MLflow run."""
    import json

    api = prefect_ui.rstrip("/") + "/api"
    for recipe, p in parents.items():
        url = p.data.tags.get("prefect_flow_run_url", "")
        c.check(f"{recipe}: the MLflow parent carries its Prefect flow run's URL ({url})",
                url.startswith(prefect_ui.rstrip("/")))
        if not url:
            continue
        text = c.visit(f"mlflow-{recipe}-prefect-link", link(p.info.run_id)["run"],
                       wait_for="Prefect flow run")
        c.check(f"{recipe}: its MLflow page links the Prefect flow run", url in text)
        text = c.visit(f"prefect-{recipe}-run", url, wait_for=p.info.run_name)
        c.check(f"{recipe}: the Prefect flow run is named as the MLflow run "
                f"({p.info.run_name})", p.info.run_name in text)
        req = urllib.request.Request(f"{api}/artifacts/filter", method="POST", data=json.dumps(
            {"artifacts": {"flow_run_id": {"any_": [p.data.tags["prefect_flow_run_id"]]}}}
        ).encode(), headers={"Content-Type": "application/json"})
        found = json.load(urllib.request.urlopen(req, timeout=30))
        c.check(f"{recipe}: its flow run published an artifact ({[a['key'] for a in found]})",
                bool(found))
        for art in found[:1]:
            text = c.visit(f"prefect-{recipe}-artifact", f"{prefect_ui.rstrip('/')}/artifacts/"
                           f"artifact/{art['id']}", wait_for="MLflow")
            first = (art.get("data") or "").splitlines()[0].strip("*").split("**")[0][:40]
            c.check(f"{recipe}: the artifact page shows the result ({first!r})", first in text)
            hrefs = c.page.eval_on_selector_all("a", "els => els.map(e => e.href)")
            c.check(f"{recipe}: the artifact links the MLflow run {p.info.run_id[:8]}",
                    any(p.info.run_id in h for h in hrefs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=ROOT / ".grpo")
    ap.add_argument("--experiment", default="recipes")
    ap.add_argument("--out", type=Path, default=None, help="screenshots (default <workdir>/reports/ui)")
    ap.add_argument("--prefect-ui", default=None,
                    help="a Prefect server's UI (deployed runs): check the cross-links and artifacts")
    args = ap.parse_args()
    from mlflow import MlflowClient
    from playwright.sync_api import sync_playwright

    wd = args.workdir.resolve()
    out = (args.out or wd / "reports" / "ui").resolve()
    out.mkdir(parents=True, exist_ok=True)
    db = wd / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        print(f"no experiment {args.experiment!r} in {db}: run `grpo run` first")
        return 2
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.data.tags["recipe"]: r for r in sorted(runs, key=lambda r: r.info.start_time)
               if r.data.tags.get("grpo.pipeline") == "parent"}
    comps = [r for r in runs if r.data.tags.get("grpo.pipeline") == "comparison"]
    benches = sorted({b for p in parents.values() for b in benchmarks_in(p.data.metrics, "final")})

    with mlflow_ui(db, free_port(), out / "mlflow-ui.log") as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        # MLflow 3.17 opens its "Assistant" side panel over a third of the page on a
        # browser's first visit (closing it is remembered): start as a user who closed it.
        context.add_init_script(ASSISTANT_CLOSED)
        page = context.new_page()
        c = Checker(page, out)
        link = lambda run=None, model=None: ui_links(  # noqa: E731
            "", exp.experiment_id, run, model, base=base)

        c.visit("landing", f"{base}/#/experiments/{exp.experiment_id}", wait_for="Traces")
        print(f"  [info] without the printed link a new browser lands on "
              f"{page.url.split('#')[1][:80]} (MLflow 3.17 starts in its GenAI mode)")

        metric = next(iter(parents.values())).data.params.get("eval.primary_metric", "")
        # The comparison run's row fills the paired delta only (its base would be another
        # recipe's final: one meaning per column)
        cells = {r.info.run_name: {col: r.data.tags.get(headline_tag(bench, metric, col))
                                   for bench in benches
                                   for col in (HEADLINE if r in parents.values() else ("delta",))}
                 for r in [*parents.values(), *comps[:1]]}
        for comp in comps[:1]:
            c.check("comparison row: base and final columns left empty",
                    not any(comp.data.tags.get(headline_tag(b, metric, col))
                            for b in benches for col in ("base", "final")))
        filled = [v for by_col in cells.values() for v in by_col.values() if v]
        text = c.visit("runs-table", link()["runs_table"], wait_for=next(iter(parents), None),
                       rows=filled)
        c.check("runs table, not the GenAI overview", "Run Name" in text and "Traces\n0" not in text)
        for bench in benches:
            for col in HEADLINE:
                tag = headline_tag(bench, metric, col)
                c.check(f"runs table shows column {tag!r}", tag in text)
        for run_name, by_col in cells.items():
            c.check(f"runs table lists {run_name}", run_name in text)
            for col, v in by_col.items():
                c.check(f"runs table: {run_name} {col} = {v!r} (value with its CI, not cut)",
                        bool(v) and "[" in v and v in text and not_cut(page, v))
        check_views_menu(c, link()["runs_table"].split("&viewStateShareKey")[0], filled)

        for recipe, p in parents.items():
            text = c.visit(f"parent-{recipe}", link(p.info.run_id)["run"], wait_for="Metrics")
            c.check(f"{recipe} page: description with the headline", f"{recipe}" in text
                    and "delta (paired)" in text)
            for bench in benches:
                for col in ("base", "final", "delta"):
                    v = p.data.metrics.get(f"{bench}/{col}")
                    c.check(f"{recipe} page: {bench}/{col} = {v}", v is not None
                            and f"{bench}/{col}" in text and any(s in text for s in shown(v)))

        for comp in comps[:1]:
            text = c.visit("comparison", link(comp.info.run_id)["run"], wait_for="Metrics")
            for key, v in sorted(comp.data.metrics.items()):
                if key.rpartition("/")[2] in HEADLINE:
                    c.check(f"comparison page: {key} = {v:.4g}",
                            key in text and any(s in text for s in shown(v)))
            c.check("comparison page: the table as its description",
                    "delta [paired 95% CI]" in text)

        said = next((r.data.tags.get("grpo.verdict") for r in comps), None)
        if comps:
            check_issue27(c, browser, base, exp, client, parents, comps, said, link)
        else:
            print("  [info] no comparison run in this experiment: its checks skipped")
        if args.prefect_ui:
            check_prefect(c, args.prefect_ui, parents, link)

        for recipe in parents:
            name = f"{exp.name}-{recipe}"
            with contextlib.suppress(Exception):
                mv = client.get_model_version_by_alias(name, "champion")
                text = c.visit(f"model-{recipe}", link(model=(name, mv.version))["model_version"],
                               wait_for="Version")
                c.check(f"{name} v{mv.version}: a model page with a schema (not a 404)",
                        "Schema" in text and not re.search(r"Inputs\s*\(0\)", text)
                        # a word: the protocol hash tag may hold "404" ("ad48a404f6...")
                        and not re.search(r"\b404\b", text) and "not found" not in text.lower())
                c.check(f"{name} v{mv.version}: alias champion shown", "champion" in text)
        browser.close()
    print(f"{c.n} pages, {c.failed} failed checks; screenshots in {out}")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
