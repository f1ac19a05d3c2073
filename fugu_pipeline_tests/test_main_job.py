"""The main job as users run it (`fugu-lite pipeline --encoder tiny`, offline): every asset from
the batch file to the promoted router materializes through Dagster, each produces what it says
(the harness too: every baseline row and the composite with its terms in the eval_report_*
metadata, promotion decided through the gates, the triage head trained and reported), a badly
named batch file is refused without stopping the rest, and a second run with nothing changed skips
every step as fresh: nothing called, encoded, trained or promoted again."""

import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from fugu_pipeline.defs.runner import DOWNSTREAM
from fugu_pipeline.matrix.read import read_arrays
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.train.pointer import pointer_target, read_pointer
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline_tests.conftest import REPO, write_jsonl

FUGU_LITE = str(REPO / ".venv" / "bin" / "fugu-lite")


def run_main_job(project: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "FUGU_ENCODER", "FUGU_PROJECT_DIR")}
    out = subprocess.run([FUGU_LITE, "pipeline", "--encoder", "tiny"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def latest(instance: dg.DagsterInstance, key: str) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(key))
    assert event is not None, f"{key} was not materialized"
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def illegible_metadata(instance: dg.DagsterInstance) -> list[str]:
    """What an asset page shows badly: a float with more than four decimals (three significant
    digits under 0.001), or an existing file or folder given as plain text instead of a path."""
    bad = []
    for key in instance.get_asset_keys():
        event = instance.get_latest_materialization_event(key)
        for name, value in (event.asset_materialization.metadata.items() if event else []):
            v = getattr(value, "value", value)
            if isinstance(v, float) and v == v and v != 0 and v != (round(v, 4) if abs(v) >= 1e-3 else float(f"{v:.3g}")):
                bad.append(f"{key.to_user_string()}.{name} = {v!r}")
            if isinstance(value, dg.TextMetadataValue) and v.startswith("/") and Path(v).exists():
                bad.append(f"{key.to_user_string()}.{name}: a path shown as text")
    return bad


@pytest.mark.slow
def test_main_job_materializes_every_asset_and_resumes(project):
    bad = write_jsonl(project / "data" / "benchgen" / "bad name!.jsonl", [{"task_id": "x"}])
    tasks = load_tasks(project / "data" / "benchgen" / "sample.jsonl")
    workers = load_workers_config(project / "configs" / "workers.mock.yaml").worker_ids
    for name in ("train_sft.yaml", "train_rl.yaml", "train_es.yaml", "promotion.yaml"):  # as a clone ships them
        (project / "configs" / name).write_text((REPO / "configs" / name).read_text())

    out = run_main_job(project)
    refused = [line for line in out.splitlines() if bad.name in line]
    assert len(refused) == 1 and "refused" in refused[0] and "must start with a letter or digit" in refused[0]
    for step in ["tasks[sample]", *(f"responses[sample|{w}]" for w in workers), "reward_matrix", *DOWNSTREAM]:
        assert any(line.split()[0] == step and "done in" in line for line in out.splitlines()), f"{step} missing:\n{out}"

    arrays = read_arrays(project / "data" / "reward_matrix.duckdb")
    assert sorted(arrays.task_ids) == sorted(t.task_id for t in tasks) and arrays.worker_ids == workers

    with dg.DagsterInstance.from_config(str(project)) as instance:  # the project's own instance (DAGSTER_HOME)
        emb = latest(instance, "task_embeddings")
        assert emb["n_prompts"] == len(tasks) and emb["n_computed"] == len({t.prompt for t in tasks})
        assert (Path(emb["cache_dir"]) / "meta.json").exists()

        checkpoints = {}
        for method in ("sft", "rl", "es"):
            meta = latest(instance, f"router_{method}")
            ckpt = Path(meta["checkpoint"])
            manifest = json.loads((ckpt / "manifest.json").read_text())
            assert ckpt.parent.name == method and (ckpt / "head.safetensors").stat().st_size > 0
            assert manifest["worker_ids"] == workers and manifest["feature_contract"]["encoder_id"] == "tiny"
            assert manifest["feature_contract"]["dim"] == emb["dim"]
            checkpoints[method] = ckpt

            rep_meta = latest(instance, f"eval_report_{method}")
            report = json.loads(Path(rep_meta["report"]).read_text())
            assert Path(rep_meta["report"]).parent == ckpt / "reports"
            assert report["n_tasks"] == sum(t.split == "test" for t in tasks) and report["worker_ids"] == workers
            assert report["oracle_utility"] >= max(report["router_utility"], report["best_fixed_utility"])
            assert report["best_fixed_worker"] in workers and sum(report["route_distribution"].values()) == report["n_tasks"]
            assert report["plots"] and all((ckpt / "reports" / p).stat().st_size > 0 for p in report["plots"])

        heads = latest(instance, "router_heads")  # the configured set (configs/train.yaml); its pick is a challenger too
        selected = Path(heads["selected"])
        manifest = json.loads((selected / "manifest.json").read_text())
        assert selected.parent.name == heads["selected_kind"] == manifest["head_kind"] and manifest["metrics"]["selected"] is True
        # the heads' own features (configs/train.yaml features:): the lexical block, the layer setting chosen
        contract = manifest["feature_contract"]
        layers = contract["layer"] if isinstance(contract["layer"], list) else [contract["layer"]]
        assert contract["lexical"] is True and manifest["metrics"]["layer_choice"]["chosen"] == f"layers {layers}"
        assert manifest["worker_ids"] == workers and contract["dim"] == emb["dim"] * len(layers) + 16
        sft_metrics = json.loads((checkpoints["sft"] / "manifest.json").read_text())["metrics"]  # as `fugu-lite train` records it
        assert manifest["metrics"]["feature_dtype"] == sft_metrics["feature_dtype"] in ("float32", "bfloat16")
        report = json.loads(Path(latest(instance, "eval_report_heads")["report"]).read_text())
        assert report["n_tasks"] == sum(t.split == "test" for t in tasks) and report["head_kind"] == manifest["head_kind"]
        checkpoints["heads"] = selected
        # the mock pool answers like real models: a cascade over the replies is fitted, chosen out of
        # fold against the one-shot heads and the best worker, and beats the one-shot head on held-out
        fitted = latest(instance, "router_cascade")  # a node of its own, against the heads of router_heads
        cascade = json.loads((Path(fitted["cascade"]) / "manifest.json").read_text())
        assert fitted["policy"] == "cascade" and cascade["metrics"]["selection"]["selected_kind"] == "cascade"
        crep = json.loads(Path(latest(instance, "eval_report_cascade")["report"]).read_text())
        assert crep["n_tasks"] == report["n_tasks"] and len(crep["per_domain"]) == 3
        vs = next(iter(crep["baselines"].values()))["cascade_minus_utility"]
        assert vs["mean"] > 0, crep["baselines"]

        es = latest(instance, "eval_report_es")  # the harness: every baseline row, the composite and its terms
        for row in ("always math-expert", "always code-expert", "always general-expert", "random (100 seeds)",
                    "| oracle |", "| cross-fit oracle |", "cross-fit oracle by domain", "| headroom |", "| router |"):
            assert row in es["baselines"], row
        assert 0 <= es["composite"] <= 1 and es["cross_fit_oracle_utility"] <= es["oracle_utility"]
        assert all(b in es["composite_terms"] for b in ("| code |", "| general |", "| math |"))
        assert "live: one call per task (route, call, grade)" in es["composite_terms"]
        es_report = json.loads(Path(es["report"]).read_text())
        assert es_report["composite"]["challenger"]["benchmarks"][0]["n_live"] > 0 and "baselines" in es_report
        triage = latest(instance, "eval_report_triage")
        assert triage["domain_accuracy"] is not None and "domain confusion" in triage["per_domain"]

        promo = latest(instance, "promoted_router")
        assert "PASS rate limit" in promo["decision"] and "PASS receipt" in promo["decision"]
        assert "challenger composite" in promo["decision"] and 0 < promo["composite"] <= 1
        pointer = read_pointer(project / "models")
        assert promo["promoted"] is True and pointer is not None
        # the cascade enters the same contest as the one-step heads; best on validation, it is the
        # challenger, and (nothing promoted yet) beats the best worker with a significant gain
        assert pointer_target(project / "models", pointer).resolve() == Path(fitted["cascade"]).resolve()
        # its live term: the live sample run as the cascade serves, through the mock pool (before:
        # left out for both heads whenever a cascade entered)
        assert "- live: a cascade: its steps as it serves" in promo["decision"], promo["decision"]
        live = [json.loads(line) for f in (project / "data" / "live").glob("*.jsonl") for line in f.read_text().splitlines()]
        ran = [r for r in live if r["worker"] == f"cascade:{cascade['content_hash']}"]
        assert ran and all(r["calls"] >= 1 and r["error"] is None for r in ran), ran
        history = (project / "models" / "promoted" / "history.jsonl").read_text().splitlines()
        assert not illegible_metadata(instance)  # every figure rounded, every file a path value, on every asset page
        # a training loop's epoch lines reach the run log as blocks, not an event (a database commit) a line
        sft_run = instance.get_latest_materialization_event(dg.AssetKey("router_sft")).run_id
        epochs = [r.user_message for r in instance.all_logs(sft_run) if "sft epoch" in (r.user_message or "")]
        assert epochs and len(epochs) < sum(m.count("sft epoch") for m in epochs), epochs
        assert json.loads(history[-1])["method"] == "cascade" and json.loads(history[-1])["promote"] is True

    from fugu_pipeline import load_promoted

    decision = load_promoted(project / "models", device="cpu").route("What is 2 + 40?", domain="math")
    assert decision.worker_id in workers and decision.score_kind == "cascade_plan"  # route runs the promoted cascade

    # the main command again, nothing changed: every step is fresh and skipped, saying since which run
    # (no call, no encoding, no training, no promotion attempt); the summary shows the figures kept
    again = run_main_job(project)
    labels = ["tasks[sample]", *(f"responses[sample|{w}]" for w in workers), "reward_matrix", *DOWNSTREAM]
    steps = {line.split()[0]: line for line in again.splitlines() if line.startswith("  ") and line.split()[0] in labels}
    assert set(steps) == set(labels), again
    assert all("skipped, fresh: " in line and "unchanged since run " in line for line in steps.values()), again
    assert "embeddings: none encoded" in again and "promotion: not tried again, no challenger changed" in again
    assert "composite" in again and "cross-fit oracle" in again and "triage: domain accuracy" in again
    assert read_pointer(project / "models")["checkpoint"] == pointer["checkpoint"]
    assert (project / "models" / "promoted" / "history.jsonl").read_text().splitlines() == history
