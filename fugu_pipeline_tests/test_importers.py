"""Importers of public routing data (RouteLLM evals, LLMRouter dcrouter, reward-matrix JSONL).

Hand-made fixtures in each upstream format always run; the tests on the real data under
`../shared/data/routing` (or $FUGU_SHARED_DATA/routing) skip when it is absent."""

import csv
import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline.matrix.import_common import assign_split
from fugu_pipeline.matrix.build import build, from_import
from fugu_pipeline.matrix.import_format import RewardRow
from fugu_pipeline.matrix.importers import (
    import_dcrouter,
    import_generic_jsonl,
    import_routellm,
    import_routellm_mmlu,
    import_source,
    read_source,
    write_reward_jsonl,
)
from fugu_pipeline.matrix.read import RewardArrays, read_arrays
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.loading import TaskFileError

REPO = Path(__file__).resolve().parents[1]
ROUTING = Path(os.environ.get("FUGU_SHARED_DATA", REPO.parent / "shared" / "data")) / "routing"

STRONG, WEAK = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_contaminated(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"train_prompt": p + " (train)", "eval_prompt": p, "train_idx": 0, "eval_idx": i}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


@pytest.fixture
def gsm8k(tmp_path):
    """A RouteLLM GSM8K-format CSV: weak model column first, response columns, a multi-line prompt."""
    rows = [[f"Question {i}: what is {i} + 1?\nThink, then answer.", i % 2 == 0, i % 3 != 0, f"ans {i}", f"ans {i}"]
            for i in range(200)]
    csv_path = write_csv(tmp_path / "gsm8k_responses.csv.gz",
                         ["prompt", WEAK, STRONG, f"{WEAK}_response", f"{STRONG}_response"], rows)
    cont = write_contaminated(tmp_path / "gsm8k_contaminated_prompts.jsonl", [rows[3][0], rows[7][0]])
    return csv_path, cont, rows


# --------------------------------------------------------------------------- RouteLLM


def test_routellm_removes_contaminated_and_keeps_quality(gsm8k):
    csv_path, cont, rows = gsm8k
    out = import_routellm(csv_path, cont)
    assert len(out) == 198
    ids = [r.task_id for r in out]
    assert "gsm8k-00003" not in ids and "gsm8k-00007" not in ids and "gsm8k-00008" in ids
    assert all(r.worker_ids == [STRONG, WEAK] for r in out)  # sorted, not CSV order
    by_id = {r.task_id: r for r in out}
    r5 = by_id["gsm8k-00005"]
    assert r5.prompt == rows[5][0] and r5.domain == "gsm8k"
    assert r5.quality == [1.0, 0.0]  # strong: 5 % 3 != 0; weak: 5 is odd
    assert len(import_routellm(csv_path)) == 200


def test_routellm_split_is_deterministic_and_disjoint(gsm8k):
    csv_path, cont, _ = gsm8k
    a = import_routellm(csv_path, cont, seed=1)
    b = import_routellm(csv_path, cont, seed=1)
    c = import_routellm(csv_path, cont, seed=2)
    assert [(r.task_id, r.split) for r in a] == [(r.task_id, r.split) for r in b]
    assert [r.split for r in a] != [r.split for r in c]
    splits = {s: {r.task_id for r in a if r.split == s} for s in ("train", "val", "test")}
    assert all(splits.values())
    assert sum(map(len, splits.values())) == len({r.task_id for r in a}) == len(a)
    assert 0.15 < len(splits["test"]) / len(a) < 0.45
    # a row's split depends only on (seed, task_id): removing other rows does not move it
    kept = {r.task_id: r.split for r in import_routellm(csv_path, None, seed=1)}
    assert all(kept[r.task_id] == r.split for r in a)
    none_val = import_routellm(csv_path, cont, val_fraction=0.0, test_fraction=0.5)
    assert {r.split for r in none_val} == {"train", "test"}


def test_routellm_bad_input(tmp_path, gsm8k):
    with pytest.raises(TaskFileError, match="file not found"):
        import_routellm(tmp_path / "nope.csv.gz")
    bad = write_csv(tmp_path / "bad.csv", ["prompt", STRONG, WEAK], [["q1", "True", "False"], ["q2", "maybe", "True"]])
    with pytest.raises(TaskFileError) as e:
        import_routellm(bad)
    assert "bad.csv" in str(e.value) and "data row 2" in str(e.value) and "'maybe'" in str(e.value)
    no_prompt = write_csv(tmp_path / "noprompt.csv", ["question", STRONG], [["q1", "True"]])
    with pytest.raises(TaskFileError, match="no 'prompt' column"):
        import_routellm(no_prompt)
    only_prompt = write_csv(tmp_path / "only.csv", ["prompt", "x_response"], [["q1", "a"]])
    with pytest.raises(TaskFileError, match="0 model column"):
        import_routellm(only_prompt)
    one = write_csv(tmp_path / "one.csv", ["prompt", STRONG], [["q1", "True"]])
    with pytest.raises(TaskFileError, match="routing needs at least 2"):
        import_routellm(one)
    spaced = write_csv(tmp_path / "spaced.csv", ["prompt", "gpt 4", WEAK], [["q1", "True", "False"]])
    with pytest.raises(TaskFileError, match="model column 'gpt 4' cannot be a worker id"):
        import_routellm(spaced)
    header_only = write_csv(tmp_path / "header.csv", ["prompt", STRONG, WEAK], [])
    with pytest.raises(TaskFileError, match="no rows"):
        import_routellm(header_only)
    cont = tmp_path / "cont.jsonl"
    cont.write_text('{"train_prompt": "x"}\n')
    with pytest.raises(TaskFileError, match="eval_prompt"):
        import_routellm(gsm8k[0], cont)
    with pytest.raises(ValueError, match="sum below 1"):
        import_routellm(gsm8k[0], test_fraction=0.7, val_fraction=0.3)


def test_routellm_mmlu_folder(tmp_path):
    folder = tmp_path / "mmlu_responses"
    same = "Which is a prime?\nA. 4\nB. 5\nAnswer:"
    write_csv(folder / "mmlu_anatomy.csv.gz", ["prompt", WEAK, STRONG], [[same, "False", "True"], ["Bones?", "True", "True"]])
    write_csv(folder / "mmlu_virology.csv.gz", ["prompt", STRONG, WEAK], [[same, "True", "True"], ["Virus?", "False", "True"]])
    cont = write_contaminated(tmp_path / "mmlu_contaminated_prompts.jsonl", ["Bones?"])
    rows = import_routellm_mmlu(folder, cont)
    assert [(r.task_id, r.domain) for r in rows] == [
        ("mmlu_anatomy-00000", "anatomy"), ("mmlu_virology-00000", "virology"), ("mmlu_virology-00001", "virology")]
    assert [r.quality for r in rows] == [[1, 0], [1, 1], [0, 1]]
    summary = import_source("routellm-mmlu", tmp_path, tmp_path / "out.jsonl")
    assert summary["rows"] == 3 and summary["contaminated_removed"] == 1
    write_csv(folder / "mmlu_zoology.csv.gz", ["prompt", STRONG, "other-model"], [["Z?", "True", "True"]])
    with pytest.raises(TaskFileError, match="every subject file must hold the same models"):
        import_routellm_mmlu(folder, cont)
    with pytest.raises(TaskFileError, match="no mmlu_"):
        import_routellm_mmlu(tmp_path / "empty")


# --------------------------------------------------------------------------- dcrouter

MODELS = ["zeta-7b", "alpha-70b", "mid-8b"]
PRICES = {"alpha-70b": (0.9, 0.9), "mid-8b": (0.2, 0.3), "zeta-7b": (0.1, 0.1), "unused-1b": (0.05, 0.05)}


def dc_record(i: int, models=MODELS, **extra) -> dict:
    return {"question": f"Q{i}: " + "x" * i, "scores": {m: round((i * (k + 1)) % 5 / 4, 2) for k, m in enumerate(models)}, **extra}


@pytest.fixture
def dcrouter(tmp_path):
    train = [dc_record(i, cluster_id=i % 3) for i in range(100)]
    test = [dc_record(i, models=list(reversed(MODELS))) for i in range(100, 120)]
    tp = tmp_path / "dcrouter_train.json.gz"
    tp.write_bytes(gzip.compress(json.dumps(train).encode()))
    sp = tmp_path / "dcrouter_test.json"
    sp.write_text(json.dumps(test))
    llm = tmp_path / "default_llm.json"
    llm.write_text(json.dumps({m: {"size": "?", "feature": "text", "input_price": a, "output_price": b, "model": f"org/{m}"}
                               for m, (a, b) in PRICES.items()}))
    queries = [{"task_name": "math" if i % 2 else "qa", "query": r["question"], "ground_truth": "1", "metric": "em"}
               for i, r in enumerate(train + test)]
    (tmp_path / "default_query_train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return tp, sp, llm, train, test


def test_dcrouter_rows(dcrouter):
    tp, sp, llm, train, test = dcrouter
    q = tp.parent / "default_query_train.jsonl"
    rows = import_dcrouter(tp, sp, llm, query_paths=[q], val_fraction=0.2, seed=3)
    assert len(rows) == 120
    assert all(r.worker_ids == sorted(MODELS) for r in rows)
    tests = [r for r in rows if r.split == "test"]
    assert [r.prompt for r in tests] == [t["question"] for t in test]
    assert {r.split for r in rows if r.task_id.startswith("dcrouter-train-")} == {"train", "val"}
    assert 5 <= sum(r.split == "val" for r in rows) <= 40
    r = rows[7]
    assert r.quality == [train[7]["scores"][m] for m in sorted(MODELS)]
    assert r.domain == "math"
    tokens = math.ceil(len(r.prompt) / 4)
    assert r.cost_usd == pytest.approx([tokens * PRICES[m][0] / 1e6 for m in sorted(MODELS)])
    with_out = import_dcrouter(tp, sp, llm, assumed_output_tokens=100)
    assert with_out[7].cost_usd[2] == pytest.approx((tokens * 0.1 + 100 * 0.1) / 1e6)
    bare = import_dcrouter(tp, sp)
    assert bare[0].cost_usd is None and bare[0].domain == "general"
    assert [(r.task_id, r.split) for r in import_dcrouter(tp, sp, llm, query_paths=[q], val_fraction=0.2, seed=3)] == \
        [(r.task_id, r.split) for r in rows]


def test_import_keeps_tags_and_reports_per_tag_and_domain(tmp_path, dcrouter):
    """Tags: `id` where the domain occurs in training, else `ood`; the upstream metric; they survive
    the matrix build and `summarize` reports per tag and per domain, with cost."""
    tp, sp, llm, train, test = dcrouter
    q = tp.parent / "default_query_train.jsonl"
    lines = q.read_text().splitlines()
    extra = {"task_name": "unseen", "query": test[0]["question"], "ground_truth": "1", "metric": "f1"}
    q.write_text("\n".join([x for x in lines if json.loads(x)["query"] != test[0]["question"]] + [json.dumps(extra)]) + "\n")
    rows = import_dcrouter(tp, sp, llm, query_paths=[q], val_fraction=0.2, seed=3)
    by_id = {r.task_id: r for r in rows}
    unseen = [r for r in rows if r.domain == "unseen"]
    assert len(unseen) == 1 and unseen[0].tags == ["metric:f1", "ood"]
    assert by_id["dcrouter-train-00007"].tags == ["metric:em", "id"]
    s = import_source("jsonl", write_reward_jsonl(rows, tmp_path / "in.jsonl"), tmp_path / "out.jsonl")
    assert s["per_tag"]["ood"]["rows"] == {"test": 1} and s["per_tag"]["id"]["rows"]["train"] > 0
    assert set(s["per_domain"]) == {"math", "qa", "unseen"} and "mean_cost_usd" in s["per_domain"]["math"]
    assert s["per_domain"]["math"]["best_on_train"] in MODELS
    build(from_import(tmp_path / "out.jsonl", UtilityConfig()), tmp_path / "m.duckdb")
    arrays = read_arrays(tmp_path / "m.duckdb")
    tags = dict(zip(arrays.task_ids, arrays.tags))
    assert tags[unseen[0].task_id] == ("metric:f1", "ood")


def test_dcrouter_bad_input(tmp_path, dcrouter):
    tp, sp, llm, train, test = dcrouter
    other = tmp_path / "other_test.json"
    other.write_text(json.dumps([dc_record(1, models=MODELS[:2])]))
    with pytest.raises(TaskFileError, match="train and test must score the same models"):
        import_dcrouter(tp, other)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([dc_record(1), dc_record(2, models=MODELS[:2])]))
    with pytest.raises(TaskFileError, match="record 1: models"):
        import_dcrouter(mixed, sp)
    out_of_range = tmp_path / "range.json"
    out_of_range.write_text(json.dumps([{"question": "q", "scores": {m: 1.5 for m in MODELS}}]))
    with pytest.raises(TaskFileError, match=r"numbers in \[0, 1\]"):
        import_dcrouter(tp, out_of_range)
    cheap = tmp_path / "llm.json"
    cheap.write_text(json.dumps({"zeta-7b": {"input_price": 0.1, "output_price": 0.1}}))
    with pytest.raises(TaskFileError, match=r"no price for models \['alpha-70b', 'mid-8b'\]"):
        import_dcrouter(tp, sp, cheap)
    with pytest.raises(TaskFileError, match="file not found"):
        import_dcrouter(tmp_path / "missing.json", sp)


# --------------------------------------------------------------------------- JSONL, writing, dispatcher


def test_write_and_read_generic_jsonl(tmp_path, gsm8k):
    rows = import_routellm(*gsm8k[:2])
    out = write_reward_jsonl(rows, tmp_path / "m.jsonl")
    back = import_generic_jsonl(out)
    assert back == rows
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"task_id", "prompt", "domain", "split", "worker_ids", "quality", "tags", "answers"}
    assert first["answers"] == ["ans 0", "ans 0"]  # each model's reply (the fixture's *_response columns), kept
    assert first["tags"] == ["source:gsm8k", "id"]  # the source, and in-distribution (its domain is in train)
    bad_rows = rows[:2] + [RewardRow(task_id="x", prompt="p", worker_ids=[WEAK, STRONG], quality=[1, 0])]
    with pytest.raises(ValueError, match="same workers in the same order"):
        write_reward_jsonl(bad_rows, out)
    assert import_generic_jsonl(out) == rows  # the failed write left the old file intact
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"task_id": "t", "prompt": "p", "worker_ids": ["a"]}) + "\n")
    with pytest.raises(TaskFileError, match="broken.jsonl:1"):
        import_generic_jsonl(broken)
    with pytest.raises(TaskFileError, match="file not found"):
        import_generic_jsonl(tmp_path / "none.jsonl")


def test_a_project_import_keeps_workers_named_as_a_list_or_one_string(tmp_path):
    """`import_options: {workers: ...}` reaches the jsonl importer as a YAML list or one
    comma-separated string: both keep the same workers; "auto" keeps every one."""
    rows = [RewardRow(task_id=f"t{i}", prompt=f"p{i}", worker_ids=["a", "b", "c"], quality=[1, 0, 1],
                      cost_usd=[0.1, 0.2, 0.3]) for i in range(4)]
    src = write_reward_jsonl(rows, tmp_path / "m.jsonl")
    listed, listed_notes = read_source("jsonl", src, workers=["c", "a"])
    typed, _ = read_source("jsonl", src, workers=" c, a ")
    assert listed == typed and {tuple(r.worker_ids) for r in listed} == {("a", "c")}
    assert [r.cost_usd for r in listed] == [[0.1, 0.3]] * 4 and listed_notes["workers_left_out"] == ["b"]
    assert read_source("jsonl", src, workers="auto")[0] == rows
    with pytest.raises(TaskFileError, match="m.jsonl: worker 'ab' is not among"):
        read_source("jsonl", src, workers="ab,c")


def test_import_source_summary(tmp_path):
    rows = [RewardRow(task_id=f"t{i}", prompt=f"p{i}", split=s, worker_ids=["a", "b"], quality=q)
            for i, (s, q) in enumerate([("train", [1, 0]), ("train", [1, 1]), ("train", [0, 0]),
                                        ("test", [0, 1]), ("test", [0, 0]), ("test", [1, 0])])]
    src = write_reward_jsonl(rows, tmp_path / "in.jsonl")
    s = import_source("jsonl", src, tmp_path / "out.jsonl")
    assert s["rows"] == 6 and s["workers"] == ["a", "b"] and s["splits"] == {"test": 3, "train": 3}
    assert s["by_split"]["test"]["mean"] == pytest.approx({"a": 1 / 3, "b": 1 / 3})
    assert s["by_split"]["test"]["oracle"] == pytest.approx(2 / 3)
    best = s["best_fixed_on_train"]
    assert best["worker"] == "a" and (best["train"], best["test"]) == pytest.approx((2 / 3, 1 / 3))
    assert (tmp_path / "out.jsonl").read_text() == src.read_text()
    with pytest.raises(ValueError, match="unknown import kind 'csv'"):
        import_source("csv", src, tmp_path / "x.jsonl")


def test_import_source_dcrouter_and_build(tmp_path, dcrouter):
    s = import_source("dcrouter", tmp_path, tmp_path / "out" / "dc.jsonl")
    assert s["rows"] == 120 and s["splits"]["test"] == 20 and s["cost_basis"].startswith("estimate")
    summary = build(from_import(tmp_path / "out" / "dc.jsonl", UtilityConfig()), tmp_path / "m.duckdb")
    assert summary["cells_filled"] == summary["cells_expected"] == 120 * 3


# --------------------------------------------------------------------------- real data


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not found: this test reads ../shared/data, which a user's clone lacks "
                    "(set FUGU_SHARED_DATA to its location)")
    return path


def round_trip(rows_path: Path, db: Path, n_rows: int, n_workers: int) -> RewardArrays:
    summary = build(from_import(rows_path, UtilityConfig()), db)
    assert summary["tasks"] == n_rows and summary["workers"] == n_workers
    assert summary["cells_filled"] == summary["cells_expected"] == n_rows * n_workers
    a = read_arrays(db)
    assert a.quality.shape == (n_rows, n_workers) and not np.isnan(a.utility).any()
    return a


def test_real_routellm_gsm8k(tmp_path):
    folder = need(ROUTING / "routellm_evals")
    s = import_source("routellm-gsm8k", folder, tmp_path / "gsm8k.jsonl")
    assert s["rows"] == 1307 and s["contaminated_removed"] == 12
    assert s["workers"] == [STRONG, WEAK]
    assert s["best_fixed_on_train"]["worker"] == STRONG
    a = round_trip(tmp_path / "gsm8k.jsonl", tmp_path / "gsm8k.duckdb", 1307, 2)
    assert set(np.unique(a.quality)) == {0.0, 1.0}


def test_real_routellm_mmlu(tmp_path):
    folder = need(ROUTING / "routellm_evals" / "mmlu_responses")
    s = import_source("routellm-mmlu", folder.parent, tmp_path / "mmlu.jsonl")
    assert s["rows"] == 14037 and s["contaminated_removed"] == 5
    rows = import_generic_jsonl(tmp_path / "mmlu.jsonl")
    assert len({r.domain for r in rows}) == len(list(folder.glob("mmlu_*.csv.gz"))) == 57
    round_trip(tmp_path / "mmlu.jsonl", tmp_path / "mmlu.duckdb", 14037, 2)


def test_real_routellm_mtbench(tmp_path):
    """RouteLLM's MT-Bench: 80 questions, 8 contaminated ones removed (SOURCES.md: 72), 2 models,
    GPT-4's 1-10 judgements of both turns averaged onto [0, 1]; the split drawn from the prompt."""
    folder = need(ROUTING / "routellm_evals")
    s = import_source("routellm-mtbench", folder, tmp_path / "mt.jsonl", test_fraction=0.5, val_fraction=0.1)
    assert s["rows"] == 72 and s["contaminated_removed"] == 8 and s["workers"] == [STRONG, WEAK]
    assert s["best_fixed_on_train"]["worker"] == STRONG
    rows = import_generic_jsonl(tmp_path / "mt.jsonl")
    assert all(r.task_id.startswith("mt_bench-") and "source:mt_bench" in r.tags for r in rows)
    assert [r.split for r in rows] == [assign_split(r.prompt, 0, 0.5, 0.1) for r in rows]
    a = round_trip(tmp_path / "mt.jsonl", tmp_path / "mt.duckdb", 72, 2)
    assert a.quality.min() >= 0 and a.quality.max() <= 1 and len(np.unique(a.quality)) > 2  # a judge's scale, not 0/1


def test_real_dcrouter(tmp_path):
    folder = need(ROUTING / "llmrouter_ulab")
    full = import_source("dcrouter", folder, tmp_path / "full.jsonl", drop_test_overlap=False)
    assert full["rows"] == 5608 + 500 and full["prompts_in_several_splits"] == 119
    s = import_source("dcrouter", folder, tmp_path / "dc.jsonl")  # default: train rows seen in test dropped
    assert len(s["workers"]) == 9 and s["prompts_in_several_splits"] == 0
    assert s["splits"]["test"] == 500 and s["splits"]["train"] + s["splits"]["val"] == 5608 - 119
    test = s["by_split"]["test"]
    assert test["oracle"] >= max(test["mean"].values())
    best = s["best_fixed_on_train"]
    assert best["test"] == pytest.approx(test["mean"][best["worker"]])
    a = round_trip(tmp_path / "dc.jsonl", tmp_path / "dc.duckdb", 6108 - 119, 9)
    assert (a.cost_usd > 0).all()


def test_import_command_takes_the_split_shares(gsm8k, tmp_path, capsys):
    """`fugu-lite import routellm-gsm8k DIR --test-fraction 0.5 --val-fraction 0.1`: the routing
    study's protocol (half of the prompts held out) from the command line; impossible shares are one line."""
    from fugu_pipeline.cli import main

    csv_path, _, _ = gsm8k
    out = tmp_path / "g.jsonl"
    assert main(["import", "routellm-gsm8k", str(csv_path.parent), "--output", str(out), "--test-fraction", "0.5",
                 "--val-fraction", "0.1"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    share = sum(r["split"] == "test" for r in rows) / len(rows)
    assert 0.4 < share < 0.6 and any(r["split"] == "val" for r in rows)
    assert [r["split"] for r in rows] == [r.split for r in import_routellm(csv_path, csv_path.parent / "gsm8k_contaminated_prompts.jsonl",
                                                                              test_fraction=0.5, val_fraction=0.1)]
    capsys.readouterr()
    for bad, words in ((["--test-fraction", "0.95", "--val-fraction", "0.1"], "sum below 1"),
                       (["--test-fraction", "1.5"], "share in [0, 1)")):
        assert main(["import", "routellm-gsm8k", str(csv_path.parent), "--output", str(tmp_path / "x.jsonl"), *bad]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    assert main(["import", "dcrouter", str(tmp_path), "--output", str(tmp_path / "y.jsonl"), "--test-fraction", "0.5"]) == 2
    assert "upstream test file" in capsys.readouterr().err
