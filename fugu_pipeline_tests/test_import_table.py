"""`fugu-lite import table`: a wide table (one column per worker's score; RouterBench's layout)
becomes reward-matrix rows; every bad cell is named by column and row and nothing is written."""

from __future__ import annotations

import gzip
import json
import shutil

import polars as pl
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.matrix.import_table import TableSpec, import_table
from fugu_pipeline.matrix.importers import import_source
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline_tests.conftest import REPO

MODELS = ["WizardLM/WizardLM-13B-V1.2", "claude-instant-v1", "gpt-4-1106-preview"]
EVALS = ["mmlu-anatomy", "gsm8k", "mbpp"]


def routerbench_like(n: int = 90) -> pl.DataFrame:
    """RouterBench's columns: sample_id, prompt, eval_name, the oracle's pick (text), and per model
    its score, its response (text) and its total cost."""
    rows = []
    for i in range(n):
        d = EVALS[i % 3]
        r = {"sample_id": f"{d}.{i}", "prompt": f"[{d}] question {i}?", "eval_name": d, "oracle_model_to_route_to": MODELS[i % 3]}
        for j, m in enumerate(MODELS):
            r[m] = float((i + j) % 3 == 0)
            r[f"{m}|model_response"] = f"answer {i}"
            r[f"{m}|total_cost"] = 0.001 * (j + 1)
        rows.append(r)
    return pl.DataFrame(rows)


SPEC = TableSpec(domain_column="eval_name", id_column="sample_id", cost_column="{worker}|total_cost")


def test_a_routerbench_like_table_becomes_rows_in_every_format(tmp_path):
    df = routerbench_like()
    paths = [tmp_path / "rb.parquet", tmp_path / "rb.csv", tmp_path / "rb.jsonl"]
    df.write_parquet(paths[0])
    df.write_csv(paths[1])
    df.write_ndjson(paths[2])
    gz = tmp_path / "rb.csv.gz"
    gz.write_bytes(gzip.compress(paths[1].read_bytes()))
    first = None
    for p in [*paths, gz]:
        rows, notes = import_table(p, SPEC)
        assert [r.worker_ids for r in rows[:1]] == [MODELS] and len(rows) == 90, p.name
        assert notes["workers_from"].startswith("auto: the 3 numeric columns")
        if first is None:
            first = rows
        assert rows == first, p.name  # the same rows whatever the format
    r = first[4]
    assert (r.task_id, r.domain, r.prompt) == ("gsm8k.4", "gsm8k", "[gsm8k] question 4?")
    assert r.quality == [0.0, 0.0, 1.0] and r.cost_usd == pytest.approx([0.001, 0.002, 0.003])
    assert {x.split for x in first} == {"train", "val", "test"} and all("id" in x.tags for x in first)
    again, _ = import_table(paths[0], SPEC)
    assert [x.split for x in again] == [x.split for x in first]  # drawn from (seed, task id)
    other, _ = import_table(paths[0], SPEC.model_copy(update={"seed": 1}))
    assert [x.split for x in other] != [x.split for x in first]
    two, notes = import_table(paths[0], TableSpec(workers=MODELS[1:], split_column=None, domain_column="eval_name"))
    assert two[0].worker_ids == MODELS[1:] and two[0].cost_usd is None and notes["workers_from"] == "--workers"


def _refused(tmp_path, df: pl.DataFrame, spec: TableSpec, *needles: str, name: str = "t.parquet"):
    p = tmp_path / name
    if name.endswith(".parquet"):
        df.write_parquet(p)
    else:
        df.write_csv(p)
    with pytest.raises(TaskFileError) as err:
        import_source("table", p, tmp_path / "out.jsonl", **spec.model_dump(exclude_defaults=True))
    msg = str(err.value)
    for n in needles:
        assert n in msg, (n, msg)
    assert not (tmp_path / "out.jsonl").exists()
    return msg


def test_every_bad_cell_is_named_by_column_and_row_and_nothing_is_written(tmp_path):
    df = routerbench_like(12)
    _refused(tmp_path, df, TableSpec(domain_column="eval_name"), "looks like a cost", "--cost-column")
    _refused(tmp_path, df, SPEC.model_copy(update={"domain_column": "task"}), "no column 'task'", "eval_name")
    _refused(tmp_path, df, SPEC.model_copy(update={"workers": ["gpt-4-1106-preview", "gpt-5"]}), "no column 'gpt-5'")
    _refused(tmp_path, df, SPEC.model_copy(update={"workers": ["gpt-4-1106-preview", "oracle_model_to_route_to"]}),
             "'oracle_model_to_route_to'", "not numbers")
    out = df.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(7.0).otherwise(pl.col("claude-instant-v1")).alias("claude-instant-v1"))
    _refused(tmp_path, out, SPEC, "column 'claude-instant-v1'", "outside [0, 1] in rows 4", "--score-range 1,10")
    gap = df.with_columns(pl.when(pl.int_range(pl.len()).is_in([1, 5])).then(None).otherwise(pl.col(MODELS[0])).alias(MODELS[0]))
    _refused(tmp_path, gap, SPEC, "2 row(s) miss a worker's score (rows 2, 6)", "--drop-incomplete")
    rows, notes = import_table(_write(tmp_path / "gap.parquet", gap), SPEC.model_copy(update={"drop_incomplete": True}))
    assert len(rows) == 10 and notes["dropped_incomplete"] == 2 and "gsm8k.1" not in {r.task_id for r in rows}
    no_ids, _ = import_table(tmp_path / "gap.parquet", SPEC.model_copy(update={"drop_incomplete": True, "id_column": None}))
    assert [r.task_id for r in no_ids][:3] == ["gap-000000", "gap-000002", "gap-000003"]  # ids are rows of the file
    dup = df.with_columns(pl.lit("same").alias("sample_id"))
    _refused(tmp_path, dup, SPEC, "column 'sample_id'", "repeated task ids in rows 1, 2, 3, 4, 5 and 7 more")
    _refused(tmp_path, df.with_columns(pl.lit("holdout").alias("split")), SPEC.model_copy(update={"split_column": "split"}),
             "column 'split'", "train, val, test")
    _refused(tmp_path, df.with_columns(pl.lit("  ").alias("prompt")), SPEC, "empty prompt in rows 1")
    nested = df.with_columns(pl.struct(pl.col("prompt"), pl.col("eval_name")).alias("prompt"))
    _refused(tmp_path, nested, SPEC, "column 'prompt' holds Struct", "name a column of text")
    listed = df.with_columns(pl.concat_list(pl.col(MODELS[0]), pl.col(MODELS[1])).alias(MODELS[2]))
    _refused(tmp_path, listed, SPEC.model_copy(update={"workers": MODELS}), f"column '{MODELS[2]}'", "not numbers")
    # a column name that could be SQL never becomes a worker id
    evil = df.rename({MODELS[0]: 'x"; DROP TABLE reward_wide; --', f"{MODELS[0]}|total_cost": 'x"; DROP TABLE reward_wide; --|total_cost'})
    _refused(tmp_path, evil, SPEC, "cannot be a worker id", "must match")
    _refused(tmp_path, df.select("prompt", MODELS[0]), TableSpec(), "found 1 worker column(s)", "at least 2")
    with pytest.raises(ValueError, match="pick one"):
        TableSpec(split_column="split", test_fraction=0.5)
    braces = df.rename({f"{m}|total_cost": f"{m}|cost{{usd}}" for m in MODELS})
    rows, _ = import_table(_write(tmp_path / "braces.parquet", braces),
                           SPEC.model_copy(update={"cost_column": "{worker}|cost{usd}"}))  # other braces are text
    assert rows[0].cost_usd == pytest.approx([0.001, 0.002, 0.003])
    with pytest.raises(ValueError, match="must contain"):
        TableSpec(cost_column="total_cost")


def _write(path, df):
    df.write_parquet(path)
    return path


def test_unreadable_or_unknown_files_are_refused(tmp_path):
    pkl = tmp_path / "routerbench_0shot.pkl"
    pkl.write_bytes(b"\x80\x04 not read")
    with pytest.raises(TaskFileError, match="unknown table format '.pkl'.*parquet"):
        import_table(pkl)
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"PAR1 truncated")
    with pytest.raises(TaskFileError, match="cannot read it as parquet"):
        import_table(broken)
    with pytest.raises(TaskFileError, match="file not found"):
        import_table(tmp_path / "none.csv")


def test_import_table_then_train_and_evaluate_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    routerbench_like(150).write_parquet(tmp_path / "rb.parquet")
    cols = ["--domain-column", "eval_name", "--id-column", "sample_id"]
    assert main(["import", "table", "rb.parquet", "--output", "rb.jsonl", *cols]) == 2
    assert "looks like a cost" in capsys.readouterr().err
    assert main(["import", "dcrouter", "rb.parquet", "--output", "x.jsonl", "--prompt-column", "q"]) == 2
    assert "is an option of `fugu-lite import table`" in capsys.readouterr().err
    assert main(["import", "table", "rb.parquet", "--output", "rb.jsonl", *cols, "--cost-column", "{worker}|total_cost"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == MODELS and summary["rows"] == 150 and set(summary["per_domain"]) == set(EVALS)
    common = ["--data", "rb.jsonl", "--workers", "configs/reward.quality.yaml", "--encoder", "tiny"]
    assert main(["train", *common, "--output", "models", "--layer-sets", "off"]) == 0
    out, err = capsys.readouterr()
    assert "no test rows" not in err
    assert main(["evaluate", "--checkpoint", out.strip().splitlines()[-1], *common, "--budget-share", "0.5"]) == 0
    assert "router" in capsys.readouterr().out


def test_real_dcrouter_written_as_a_table_imports_to_the_same_rows(tmp_path):
    """The real dcrouter matrix (9 models, 5,989 prompts) through its own importer, written out as
    a wide Parquet table (prompt, domain, split, id, one column per model, one cost column per
    model), comes back through `import table` as the same rows."""
    from fugu_pipeline_tests.test_importers import ROUTING, need

    folder = need(ROUTING / "llmrouter_ulab")
    import_source("dcrouter", folder, tmp_path / "dc.jsonl")
    ref = [json.loads(x) for x in (tmp_path / "dc.jsonl").read_text(encoding="utf-8").split("\n") if x]  # not splitlines: a prompt holds U+0085 (NEL)
    workers = ref[0]["worker_ids"]
    table = pl.DataFrame({"task": [r["task_id"] for r in ref], "question": [r["prompt"] for r in ref],
                          "task_name": [r["domain"] for r in ref], "part": [r["split"] for r in ref],
                          **{w: [r["quality"][j] for r in ref] for j, w in enumerate(workers)},
                          **{f"{w} cost": [r["cost_usd"][j] for r in ref] for j, w in enumerate(workers)}})
    table.write_parquet(tmp_path / "dc.parquet")
    spec = TableSpec(prompt_column="question", domain_column="task_name", split_column="part", id_column="task",
                     cost_column="{worker} cost")
    rows, notes = import_table(tmp_path / "dc.parquet", spec)
    assert notes["workers_from"] == "auto: the 9 numeric columns no other option names"
    assert len(rows) == len(ref) == 5989
    for r, want in zip(rows, ref):
        got = r.model_dump()
        for k in ("task_id", "prompt", "domain", "split", "worker_ids", "quality", "cost_usd"):
            assert got[k] == want[k], (k, want["task_id"])
        assert [t for t in got["tags"] if t in ("id", "ood")] == [t for t in want["tags"] if t in ("id", "ood")]


SPROUT_MODELS = ["openai-gpt-4o", "openai-gpt-4o-mini", "wxai-llama-3-1-8b-instruct"]


def sprout_like(n: int, offset: int = 0) -> pl.DataFrame:
    """SPROUT's layout (CARROT): meta columns key, dataset, dataset_level, dataset_idx, prompt,
    golden_answer, and per model a record {score, num_input_tokens, num_output_tokens, response}."""
    rows = []
    for i in range(offset, offset + n):
        r = {"key": f"k{i}", "dataset": ["mmlu-pro", "math", "ragbench"][i % 3], "dataset_level": i % 5, "dataset_idx": i,
             "prompt": f"Question {i}?", "golden_answer": "42"}
        for j, m in enumerate(SPROUT_MODELS):
            r[m] = {"score": float((i + j) % 2), "num_input_tokens": 100 + i, "num_output_tokens": 10 * (j + 1), "response": "x"}
        rows.append(r)
    return pl.DataFrame(rows)


def test_sprout_records_per_model_with_token_counts_and_a_price_list(tmp_path, monkeypatch, capsys):
    """Each model's column holds a record; the score is its `score` field; the cost of a call comes
    from its token counts at the price list's rates. SPROUT ships train, validation and test files."""
    sprout_like(30).write_parquet(tmp_path / "train.parquet")
    sprout_like(10, 30).write_parquet(tmp_path / "test.parquet")
    (tmp_path / "prices.yaml").write_text("openai-gpt-4o: {input: 2.5, output: 10}\nopenai-gpt-4o-mini: {input: 0.15, output: 0.6}\n"
                                          "wxai-llama-3-1-8b-instruct: {input: 0.1, output: 0.1}\n", encoding="utf-8")
    spec = TableSpec(id_column="key", domain_column="dataset", prices=tmp_path / "prices.yaml", test_file=tmp_path / "test.parquet")
    rows, notes = import_table(tmp_path / "train.parquet", spec)
    assert notes["files"]["train.parquet"]["workers_from"] == "auto: the 3 columns of records with a 'score' field"
    assert rows[0].worker_ids == SPROUT_MODELS and len(rows) == 40 and rows[-1].split == "test"  # dataset_idx is no worker
    assert rows[1].quality == [1.0, 0.0, 1.0]
    assert rows[1].cost_usd == pytest.approx([(101 * 2.5 + 10 * 10) / 1e6, (101 * 0.15 + 20 * 0.6) / 1e6, (101 * 0.1 + 30 * 0.1) / 1e6])
    (tmp_path / "short.yaml").write_text("openai-gpt-4o: {input: 2.5, output: 10}\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"short\.yaml.*no price for worker\(s\) \['openai-gpt-4o-mini'"):
        import_table(tmp_path / "train.parquet", spec.model_copy(update={"prices": tmp_path / "short.yaml"}))
    (tmp_path / "neg.yaml").write_text("openai-gpt-4o: {input: -1, output: 10}\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"neg\.yaml.*openai-gpt-4o\.input: Input should be greater than or equal to 0"):
        import_table(tmp_path / "train.parquet", spec.model_copy(update={"prices": tmp_path / "neg.yaml"}))
    with pytest.raises(TaskFileError, match="records without a 'correct' field"):
        import_table(tmp_path / "train.parquet", spec.model_copy(update={"score_field": "correct", "workers": SPROUT_MODELS}))
    with pytest.raises(TaskFileError, match="no 'tokens_in' field"):
        import_table(tmp_path / "train.parquet", spec.model_copy(update={"input_tokens_field": "tokens_in"}))
    with pytest.raises(ValueError, match="pick one"):
        TableSpec(prices=tmp_path / "prices.yaml", cost_column="{worker}|cost")
    monkeypatch.chdir(tmp_path)
    assert main(["import", "table", "train.parquet", "--test-file", "test.parquet", "--id-column", "key", "--domain-column",
                 "dataset", "--prices", "prices.yaml", "--output", "s.jsonl"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 40
    assert main(["import", "long", "train.parquet", "--prices", "prices.yaml", "--output", "x.jsonl"]) == 2
    assert "--prices is an option of `fugu-lite import table`" in capsys.readouterr().err
