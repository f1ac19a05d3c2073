"""`benchmarks/routellm_mix.py`: RouteLLM's GSM8K and MMLU as one import, read from the release
where it lies (the test skips, saying why, where it does not)."""

import subprocess
import sys
from pathlib import Path

from fugu_pipeline.matrix.import_format import read_reward_jsonl
from fugu_pipeline_tests.test_importers import ROUTING, need

ROOT = Path(__file__).resolve().parents[1]


def test_the_mix_holds_both_sets_priced_without_replies_with_or_without_domains(tmp_path):
    evals = need(ROUTING / "routellm_evals")
    for flags, domains in (([], {"gsm8k", "mmlu"}), (["--no-domains"], {"general"})):
        out = tmp_path / "mix.jsonl"
        run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "routellm_mix.py"), str(evals), "--out", str(out),
                              "--per-set", "40", *flags], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        rows = read_reward_jsonl(out)
        assert len(rows) == 80 and {r.domain for r in rows} == domains
        assert sum(r.task_id.startswith("gsm8k") for r in rows) == 40
        assert all(r.answers is None and all(c > 0 for c in r.cost_usd) for r in rows)
        gpt4 = rows[0].worker_ids.index("gpt-4-1106-preview")
        assert all(r.cost_usd[gpt4] > 50 * min(r.cost_usd) for r in rows)  # priced at RouteLLM's own figures
        assert "wrote" in run.stdout and "gsm8k: 40 rows" in run.stdout
    again = tmp_path / "again.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "routellm_mix.py"), str(evals), "--out", str(again),
                    "--per-set", "40", "--no-domains"], check=True, capture_output=True, cwd=ROOT)
    assert again.read_bytes() == out.read_bytes()  # the same rows, splits and prices every run


def test_a_folder_without_the_release_is_one_line_naming_it(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "routellm_mix.py"), str(tmp_path), "--out",
                          str(tmp_path / "x.jsonl")], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and f"{tmp_path}: no gsm8k_responses.csv(.gz) here" in run.stderr
    assert not (tmp_path / "x.jsonl").exists()
