"""The Dagster UI in a real browser: Debian's headless Chromium, driven by Playwright, against
`dagster dev` on loopback over a project the main job has run once. The asset graph shows every
asset, a materialization launched from the UI completes, the evaluation report's plots render, the
sensors are listed as running, a failed run's log shows its one-line failure with the file, line
and fix, and every plot of two reports renders. Screenshots go to $FUGU_TEST_OUTPUT/ui/ (default: fugu-test-output/ui/ in the temp folder). Runs with
FUGU_SERVICE_TESTS=1 where /usr/bin/chromium is installed."""

from __future__ import annotations

import re
import subprocess
import tempfile
import urllib.request

import dagster as dg
import pytest

from fugu_pipeline_tests.conftest import ONE_POINT_HEADS, short_training
from fugu_pipeline_tests.scale_project import OUTPUT, Child, make_project, project_env
from fugu_pipeline_tests.waiting import wait_until
from fugu_pipeline_tests.services import REPO, VENV_BIN, free_port, installed, require_service_tests, split_sample

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ASSETS = ["openrouter_catalog", "tasks", "responses", "reward_matrix", "task_embeddings", "router_sft", "router_rl",
          "router_es", "eval_report_sft", "eval_report_rl", "eval_report_es", "promoted_router"]
SENSORS = ["benchgen_batch_sensor", "reward_matrix_automation", "catalog_update_sensor"]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_dagster_ui_in_headless_chromium(tmp_path):
    require_service_tests("Dagster UI in a browser")
    reason = installed("chromium")
    if reason:
        pytest.skip(reason)
    sync_playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')").sync_playwright
    shots = OUTPUT / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    project = make_project(tmp_path / "project", REPO / "dagster.yaml")
    split_sample(project, {"sample": 90})
    short_training(project, cascade=False)  # the pages need every asset, not the shipped search
    with (project / "configs" / "train.yaml").open("a") as fh:
        fh.write(ONE_POINT_HEADS)
    env = project_env(project)
    # up to the last report the pages show (eval_report_heads): the promotion and the triage head after it
    # are on no page here (their asset nodes are in the graph either way)
    main = subprocess.run([str(VENV_BIN / "fugu-lite"), "pipeline", "--encoder", "tiny", "--workers", "configs/workers.slow.yaml",
                           "--stop-after", "eval_report_heads"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert main.returncode == 0, main.stdout[-2000:] + main.stderr[-2000:]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ui = Child([str(VENV_BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
               project, env, tmp_path / "dagster-dev.log")
    instance = dg.DagsterInstance.from_config(str(project))
    taken: list[str] = []
    try:
        wait_until(lambda: _up(f"{base}/server_info"), "dagster dev answering", every=2, alive=ui.exited)
        with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="fugu-chromium-") as profile:
            browser = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS,
                                                           viewport={"width": 1600, "height": 1000})
            page = browser.new_page()
            page.set_default_timeout(120_000)

            def shot(name: str) -> None:
                page.screenshot(path=str(shots / name), full_page=False)
                taken.append(name)

            def dismiss() -> None:  # the UI's one-time "Join the Dagster community" dialog, when it shows
                skip = page.get_by_role("button", name="Skip")
                if skip.count():
                    skip.first.click()

            # 1. the asset graph: every asset of the pipeline is a node (groups expanded: ⌥E)
            page.goto(f"{base}/asset-groups")
            page.get_by_text("training", exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(3000)
            dismiss()
            page.keyboard.press("Alt+e")
            for asset in ASSETS:
                page.get_by_text(asset, exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(1500)
            shot("1-asset-graph.png")

            # 1b. an asset that calls live workers says so on its page: its kind, tag and description
            page.goto(f"{base}/assets/router_roles")
            page.get_by_text("live-calls").first.wait_for(state="visible")
            page.get_by_text("Calls the configured workers live").first.wait_for(state="visible")
            dismiss()
            page.wait_for_timeout(1500)
            shot("1b-live-calls-asset.png")

            # 2. a materialization launched from the UI: reward_matrix's page, "Materialize", the run succeeds
            before = {r.run_id for r in instance.get_runs()}
            page.goto(f"{base}/assets/reward_matrix")
            materialize = page.get_by_role("button").filter(has_text=re.compile(r"^\s*Materialize\s*$")).first
            materialize.wait_for(state="visible")
            dismiss()
            materialize.click()
            page.get_by_text("Launched run").first.wait_for(state="visible")

            def launched():
                try:
                    runs = instance.get_runs()
                except Exception as exc:  # sqlalchemy's OperationalError: the run's worker is writing the sqlite file
                    if "database is locked" in str(exc):
                        return None  # read it at the next poll
                    raise
                new = [r for r in runs if r.run_id not in before
                       and dg.AssetKey("reward_matrix") in (r.asset_selection or set())]
                return new[0] if new and new[0].is_finished else None

            run = wait_until(launched, "the run launched from the UI finishing", every=2, alive=ui.exited)
            assert run.status == dg.DagsterRunStatus.SUCCESS, run.status
            page.goto(f"{base}/runs/{run.run_id}")
            page.get_by_text("Success").first.wait_for(state="visible")
            page.wait_for_timeout(1500)
            shot("2-run-launched-from-ui.png")

            # 3. the evaluation report's plots: images in the materialization's metadata, really drawn
            page.goto(f"{base}/assets/eval_report_sft")
            row = page.locator("tr", has=page.get_by_text("plots", exact=True)).first
            row.wait_for(state="visible")
            dismiss()
            row.scroll_into_view_if_needed()
            row.get_by_text("[Show Markdown]").first.click()
            page.wait_for_timeout(2000)
            widths = page.eval_on_selector_all("img[src^='data:image/png']", "els => els.map(e => e.naturalWidth)")
            assert widths and all(100 < w <= 640 for w in widths), widths
            # each plot fits the "Show Markdown" dialog: no image reaches past the dialog's right edge
            overflow = page.eval_on_selector_all(
                "img[src^='data:image/png']",
                "els => els.map(e => { const d = e.closest('.bp5-dialog'); "
                "return d ? e.getBoundingClientRect().right - d.getBoundingClientRect().right : 0; })")
            assert all(x <= 0 for x in overflow), overflow
            shot("3-eval-report-plots.png")

            # 4. the sensors, listed as running
            page.goto(f"{base}/automation")
            for sensor in SENSORS:
                page.get_by_text(sensor, exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(1500)
            dismiss()
            # each row: a selection box, then the on/off switch; the rows in name order
            names = [n for n in ("benchgen_batch_sensor", "catalog_change_sensor", "catalog_update_sensor",
                                 "openrouter_catalog_schedule", "reward_matrix_automation")]
            # the names can show before every row's box and switch has rendered (seen under load): wait for
            # all of them (the select-all box, then a box and a switch per row) before reading them
            page.wait_for_function(f"document.querySelectorAll('input[type=checkbox]').length >= {1 + 2 * len(names)}",
                                   timeout=60_000)
            boxes = page.eval_on_selector_all("input[type=checkbox]", "els => els.map(e => e.checked)")
            assert len(boxes[2::2]) >= len(names), f"{len(boxes)} checkboxes on the automation page for {names}"
            switches = dict(zip(names, boxes[2::2]))
            shot("4-sensors-running.png")

            # 5. a failed run's log: a batch file with a bad line, picked up by the batch sensor, fails its load
            # in one line with the file, the line and the fix as the failure's metadata
            (project / "data" / "benchgen" / "badline.jsonl").write_text(
                (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[0] + '\n{"task_id": "x", \n')

            def failed_load():
                runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], tags={"dagster/partition": "badline"}))
                return runs[0] if runs else None

            failed = wait_until(failed_load, "the bad batch's load failing", every=2, alive=ui.exited)
            page.goto(f"{base}/runs/{failed.run_id}")
            page.get_by_text("badline.jsonl:2: malformed JSON").first.wait_for(state="visible")
            dismiss()
            for label in ("file", "line", "fix"):
                page.get_by_text(label, exact=True).first.wait_for(state="visible")
            page.wait_for_timeout(1500)
            # the failure's red line holds the fix, and no stack is shown (not under the step's failure,
            # nor again under the run's)
            assert page.get_by_text(re.compile(r"badline\.jsonl:2: malformed JSON.* — fix: correct line 2")).count() >= 1
            assert page.get_by_text("Stack Trace", exact=False).count() == 0
            shot("5-failed-run-log.png")

            # 6. every plot of the reports, each as the asset page renders it
            for asset in ("eval_report_sft", "eval_report_heads"):
                page.goto(f"{base}/assets/{asset}")
                row = page.locator("tr", has=page.get_by_text("plots", exact=True)).first
                row.wait_for(state="visible")
                dismiss()
                row.scroll_into_view_if_needed()
                row.get_by_text("[Show Markdown]").first.click()
                images = page.locator("img[src^='data:image/png']")
                images.first.wait_for(state="visible")
                page.wait_for_timeout(1000)
                names = [images.nth(i).get_attribute("alt") for i in range(images.count())]
                assert {"test_summary.png", "test_per_domain.png", "test_curve.png"} <= set(names), names
                for i, name in enumerate(names):
                    images.nth(i).scroll_into_view_if_needed()
                    images.nth(i).screenshot(path=str(shots / f"6-{asset}-{name}"))
                    taken.append(f"6-{asset}-{name}")
                page.keyboard.press("Escape")
            browser.close()
    finally:
        ui.stop()
    print("screenshots:", [str(shots / t) for t in taken], "switches:", switches)
    assert all(switches[s] for s in SENSORS), switches  # on by default
    assert not switches["catalog_change_sensor"] and not switches["openrouter_catalog_schedule"]  # off: they spend money
    assert len(taken) >= 6 + 6
