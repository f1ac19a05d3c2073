"""`fugu-lite import long`: one row per (prompt, worker) call (a production log, per-sample
leaderboard details, EmbedLLM's files) becomes the same reward-matrix rows as the wide table it
pivots to; every bad cell is named by column and file row, and nothing is written."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.matrix.import_long import LongSpec, import_long
from fugu_pipeline.matrix.import_table import import_table
from fugu_pipeline.matrix.importers import import_source
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.test_import_table import MODELS, SPEC, routerbench_like

LONG = LongSpec(worker_column="model", score_column="score", id_column="sample_id", domain_column="eval_name",
                cost_column="cost")


def melt(wide: pl.DataFrame) -> pl.DataFrame:
    """The wide RouterBench-like frame as one row per (sample, model), models interleaved per sample."""
    parts = [wide.select("sample_id", "prompt", "eval_name", pl.lit(m).alias("model"), pl.col(m).alias("score"),
                         pl.col(f"{m}|total_cost").alias("cost")).with_row_index("i") for m in MODELS]
    return pl.concat(parts).sort("i", maintain_order=True).drop("i")


def test_a_long_table_imports_to_the_same_rows_as_its_wide_form_in_every_format(tmp_path):
    wide = routerbench_like(60)
    wide.write_parquet(tmp_path / "w.parquet")
    want, _ = import_table(tmp_path / "w.parquet", SPEC)
    long = melt(wide)
    for name in ("l.parquet", "l.csv", "l.jsonl"):
        p = tmp_path / name
        {"parquet": long.write_parquet, "csv": long.write_csv, "jsonl": long.write_ndjson}[name.split(".")[1]](p)
        rows, notes = import_long(p, LONG)
        assert rows == want, name
        assert notes["workers"] == MODELS and notes["table"] == "180 rows x 6 columns"
    # rows in any order give the same tasks (in order of first appearance) and the same splits
    (tmp_path / "shuffled").mkdir()
    shuffled = long.sample(fraction=1.0, shuffle=True, seed=3)
    shuffled.write_parquet(tmp_path / "shuffled" / "l.parquet")
    again, _ = import_long(tmp_path / "shuffled" / "l.parquet", LONG)
    assert [r.task_id for r in again] != [r.task_id for r in want]
    assert sorted(again, key=lambda r: r.task_id) == sorted(want, key=lambda r: r.task_id)
    # without an id column the prompt tells tasks apart; the id hashes it, so it survives reordering
    by_prompt, _ = import_long(tmp_path / "l.parquet", LONG.model_copy(update={"id_column": None}))
    re_by_prompt, _ = import_long(tmp_path / "shuffled" / "l.parquet", LONG.model_copy(update={"id_column": None}))
    assert len(by_prompt) == 60 and by_prompt[0].task_id.startswith("l-") and len(by_prompt[0].task_id) == 14
    assert sorted(by_prompt, key=lambda r: r.task_id) == sorted(re_by_prompt, key=lambda r: r.task_id)
    assert {r.prompt: r.quality for r in by_prompt} == {r.prompt: r.quality for r in want}
    # a subset of workers; the others' rows are counted and left out
    two, notes = import_long(tmp_path / "l.parquet", LONG.model_copy(update={"workers": MODELS[1:]}))
    assert two[0].worker_ids == MODELS[1:] and notes["rows_of_other_workers"] == 60
    # the same workers as one YAML string (import_options.workers: "b, c"), as `import jsonl` reads it
    spec = LongSpec(**{**LONG.model_dump(), "workers": f"{MODELS[1]}, {MODELS[2]}"})
    assert spec.workers == MODELS[1:] and import_long(tmp_path / "l.parquet", spec)[0] == two
    assert LongSpec(**{**LONG.model_dump(), "workers": "auto"}).workers == "auto"


def test_prompts_in_their_own_table_are_joined_by_id_as_embedllm_keeps_them(tmp_path):
    wide = routerbench_like(30)
    wide.write_parquet(tmp_path / "w.parquet")
    want, _ = import_table(tmp_path / "w.parquet", SPEC)
    long = melt(wide)
    long.select("sample_id", "model", "score", "cost").write_csv(tmp_path / "responses.csv")
    questions = wide.select("sample_id", "prompt", "eval_name")
    pl.concat([questions, pl.DataFrame({"sample_id": ["unused"], "prompt": ["never asked"], "eval_name": ["x"]})]
              ).write_csv(tmp_path / "questions.csv")
    spec = LONG.model_copy(update={"prompts": tmp_path / "questions.csv"})
    rows, notes = import_long(tmp_path / "responses.csv", spec)
    assert rows == want and notes["prompts_without_responses"] == 1
    with pytest.raises(ValueError, match="name the id column"):
        LongSpec(prompts=tmp_path / "questions.csv")
    pl.concat([questions, questions.head(1)]).write_csv(tmp_path / "twice.csv")
    with pytest.raises(TaskFileError, match=r"twice\.csv.*'sample_id': missing or repeated task ids in rows 1, 31"):
        import_long(tmp_path / "responses.csv", LONG.model_copy(update={"prompts": tmp_path / "twice.csv"}))
    questions.tail(29).write_csv(tmp_path / "short.csv")
    with pytest.raises(TaskFileError, match=r"responses\.csv.*lacks, rows 1, 2, 3 \(e\.g\. 'mmlu-anatomy\.0'\)"):
        import_long(tmp_path / "responses.csv", LONG.model_copy(update={"prompts": tmp_path / "short.csv"}))


def _refused(tmp_path, df: pl.DataFrame, spec: LongSpec, *needles: str):
    p = tmp_path / "l.parquet"
    df.write_parquet(p)
    with pytest.raises(TaskFileError) as err:
        import_source("long", p, tmp_path / "out.jsonl", **spec.model_dump(exclude_defaults=True))
    msg = str(err.value)
    for n in needles:
        assert n in msg, (n, msg)
    assert "l.parquet" in msg
    assert not (tmp_path / "out.jsonl").exists()


def _set(df: pl.DataFrame, col: str, rows: list[int], value) -> pl.DataFrame:
    """`value` in `col` at the given 1-based data rows."""
    return df.with_columns(pl.when(pl.int_range(pl.len()).is_in([r - 1 for r in rows])).then(pl.lit(value))
                           .otherwise(pl.col(col)).alias(col))


def test_every_bad_cell_is_named_by_column_and_file_row_and_nothing_is_written(tmp_path):
    long = melt(routerbench_like(12))  # 36 rows: sample i's models at rows 3i+1 .. 3i+3
    _refused(tmp_path, _set(long, "score", [5], 4.0), LONG, "column 'score'", "outside [0, 1] in rows 5", "--score-range 1,10")
    _refused(tmp_path, _set(long, "score", [7, 8], None), LONG, "missing score in rows 7, 8", "--drop-incomplete")
    _refused(tmp_path, _set(long, "score", [2], float("nan")), LONG, "missing score in rows 2")
    _refused(tmp_path, long.with_columns(pl.col("score").cast(pl.String)), LONG, "column 'score'", "not numbers")
    _refused(tmp_path, _set(long, "cost", [9], -1.0), LONG, "column 'cost'", "negative or infinite cost in rows 9")
    _refused(tmp_path, _set(long, "model", [4], 'x"; DROP TABLE reward_wide; --'), LONG,
             "column 'model'", "(rows 4) cannot be a worker id", "must match")
    _refused(tmp_path, _set(long, "model", [4], None), LONG, "missing worker in rows 4")
    _refused(tmp_path, _set(long, "eval_name", [6], "mbpp"), LONG,
             "column 'eval_name': task 'gsm8k.1' has 2 different values (rows 4, 5, 6)", "must be the same on each of its rows")
    _refused(tmp_path, long.with_columns(pl.lit("holdout").alias("split")), LONG.model_copy(update={"split_column": "split"}),
             "column 'split'", "train, val, test; rows 1, 2, 3, 4, 5 and 31 more")
    _refused(tmp_path, _set(long, "prompt", [1, 2, 3], " "), LONG, "column 'prompt': empty prompt in rows 1")
    _refused(tmp_path, _set(long, "sample_id", [1], None), LONG, "column 'sample_id': missing task id in rows 1")
    _refused(tmp_path, long.filter(pl.col("model") != MODELS[0]).head(1), LONG, "names 1 worker(s)", "at least 2")
    _refused(tmp_path, long, LONG.model_copy(update={"workers": [MODELS[0], "gpt-5"]}), "never names worker 'gpt-5'")
    _refused(tmp_path, long, LONG.model_copy(update={"worker_column": "llm"}), "no column 'llm'", "the responses table")
    nested = long.with_columns(pl.struct("prompt", "eval_name").alias("prompt"))
    _refused(tmp_path, nested, LONG, "column 'prompt' holds Struct")
    # a repeated (task, worker) pair: refused by default, averaged on request (costs too)
    extra = long.head(1).with_columns(pl.lit(0.0).alias("score"), pl.lit(0.003).alias("cost"))
    twice = pl.concat([long, extra])
    _refused(tmp_path, twice, LONG, "task 'mmlu-anatomy.0' has 2 rows for worker", "(rows 1, 37)", "--duplicates mean")
    twice.write_parquet(tmp_path / "twice.parquet")
    rows, notes = import_long(tmp_path / "twice.parquet", LONG.model_copy(update={"duplicates": "mean"}))
    assert notes["pairs_averaged"] == 1 and rows[0].quality[0] == 0.5 and rows[0].cost_usd[0] == pytest.approx(0.002)
    # a task missing a worker: refused, or left out and counted; later errors still name the file's rows
    gap = long.filter(pl.int_range(pl.len()) != 4)  # sample 1 lacks its second model
    _refused(tmp_path, gap, LONG, "1 task(s) lack a score from some of the 3 workers (e.g. 'gsm8k.1')", "--drop-incomplete")
    gap.write_parquet(tmp_path / "gap.parquet")
    rows, notes = import_long(tmp_path / "gap.parquet", LONG.model_copy(update={"drop_incomplete": True}))
    assert len(rows) == 11 and notes["dropped_incomplete"] == 1 and "gsm8k.1" not in {r.task_id for r in rows}
    with pytest.raises(ValueError, match="one column, not a {worker} template"):
        LongSpec(cost_column="{worker}|total_cost")
    with pytest.raises(ValueError, match="pick one"):
        LongSpec(split_column="split", test_fraction=0.5)


def test_after_drop_incomplete_a_wide_table_still_names_the_rows_of_the_file(tmp_path):
    """Dropped rows used to shift the row numbers of every later message."""
    df = routerbench_like(12)
    df = df.with_columns(pl.when(pl.int_range(pl.len()) == 1).then(None).otherwise(pl.col(MODELS[0])).alias(MODELS[0]))
    df = df.with_columns(pl.when(pl.int_range(pl.len()) == 6).then(3.0).otherwise(pl.col(MODELS[1])).alias(MODELS[1]))
    df.write_parquet(tmp_path / "t.parquet")
    with pytest.raises(TaskFileError, match=r"outside \[0, 1\] in rows 7 "):
        import_table(tmp_path / "t.parquet", SPEC.model_copy(update={"drop_incomplete": True}))


def test_import_long_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    melt(routerbench_like(30)).write_csv(tmp_path / "calls.csv")
    args = ["import", "long", "calls.csv", "--output", "r.jsonl", "--id-column", "sample_id", "--domain-column", "eval_name",
            "--cost-column", "cost"]
    assert main([*args, "--duplicates", "mean", "--workers", ",".join(MODELS[:2])]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == MODELS[:2] and summary["rows"] == 30 and summary["rows_of_other_workers"] == 30
    rows = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text(encoding="utf-8").split("\n") if x]
    assert rows[0]["worker_ids"] == MODELS[:2] and rows[0]["cost_usd"] == pytest.approx([0.001, 0.002])
    assert main(["import", "table", "calls.csv", "--output", "x.jsonl", "--score-column", "score"]) == 2
    assert "--score-column is an option of `fugu-lite import long`" in capsys.readouterr().err
    assert main([*args, "--cost-column", "{worker}|cost"]) == 2
    assert "import long:" in capsys.readouterr().err
    assert main([*args, "--worker-column", "llm"]) == 2
    assert "no column 'llm'" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_real_dcrouter_as_one_row_per_call_imports_to_the_same_rows(tmp_path):
    """The real dcrouter matrix (9 models, 5,989 prompts) written out as 53,901 calls, its
    prompts in a second table, comes back through `import long` as the same rows."""
    from fugu_pipeline_tests.test_importers import ROUTING, need

    folder = need(ROUTING / "llmrouter_ulab")
    import_source("dcrouter", folder, tmp_path / "dc.jsonl")
    ref = [json.loads(x) for x in (tmp_path / "dc.jsonl").read_text(encoding="utf-8").split("\n") if x]
    workers = ref[0]["worker_ids"]
    calls = pl.DataFrame({"qid": [r["task_id"] for r in ref for _ in workers], "llm": [w for _ in ref for w in workers],
                          "correct": [q for r in ref for q in r["quality"]], "usd": [c for r in ref for c in r["cost_usd"]]})
    calls.sample(fraction=1.0, shuffle=True, seed=0).write_parquet(tmp_path / "calls.parquet")
    pl.DataFrame({"qid": [r["task_id"] for r in ref], "text": [r["prompt"] for r in ref], "task": [r["domain"] for r in ref],
                  "part": [r["split"] for r in ref]}).write_parquet(tmp_path / "questions.parquet")
    spec = LongSpec(worker_column="llm", score_column="correct", id_column="qid", prompt_column="text",
                    domain_column="task", split_column="part", cost_column="usd", prompts=tmp_path / "questions.parquet",
                    workers=workers)
    rows, notes = import_long(tmp_path / "calls.parquet", spec)
    assert len(rows) == len(ref) == 5989 and notes["table"] == "53901 rows x 4 columns"
    got = {r.task_id: r.model_dump() for r in rows}
    for want in ref:
        g = got[want["task_id"]]
        for k in ("prompt", "domain", "split", "worker_ids", "quality", "cost_usd"):
            assert g[k] == want[k], (k, want["task_id"])


def embedllm_like(ids: range, models: list[str]) -> pl.DataFrame:
    """EmbedLLM's columns: prompt_id, model_id, model_name, category, label, prompt (one row per pair)."""
    return pl.DataFrame([{"prompt_id": i, "model_id": j, "model_name": m, "category": ["math", "code"][i % 2],
                          "label": (i * 7 + j) % 3 == 0, "prompt": f"Question {i}"} for i in ids for j, m in enumerate(models)])


def test_a_file_per_split_as_embedllm_ships_them(tmp_path, capsys, monkeypatch):
    models = ["meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "google/gemma-7b"]
    embedllm_like(range(0, 40), models).write_csv(tmp_path / "train.csv")
    embedllm_like(range(40, 50), models).write_csv(tmp_path / "val.csv")
    test = embedllm_like(range(50, 60), models)
    test.write_csv(tmp_path / "test.csv")
    spec = LongSpec(worker_column="model_name", score_column="label", id_column="prompt_id", domain_column="category",
                    test_file=tmp_path / "test.csv", val_file=tmp_path / "val.csv")
    rows, notes = import_long(tmp_path / "train.csv", spec)
    assert [r.split for r in rows] == ["train"] * 40 + ["val"] * 10 + ["test"] * 10
    assert rows[0].worker_ids == sorted(models) and notes["splits_from"] == "train: train.csv, val: val.csv, test: test.csv"
    assert notes["files"]["test.csv"]["rows"] == 10 and all("id" in r.tags for r in rows)
    # a held-out prompt also asked in training: the training row is dropped and counted
    pl.concat([test.filter(pl.col("prompt_id") == 55).with_columns(pl.lit(7).alias("prompt_id")).with_columns(
        pl.col("prompt_id").cast(pl.Int64)), embedllm_like(range(0, 40), models).filter(pl.col("prompt_id") != 7)],
        how="vertical_relaxed").write_csv(tmp_path / "train2.csv")
    rows, notes = import_long(tmp_path / "train2.csv", spec)
    assert len(rows) == 59 and notes["train_rows_dropped_as_in_a_held_out_file"] == 1
    # the same task id in two files; a file with other workers; one file for two splits
    embedllm_like(range(35, 45), models).write_csv(tmp_path / "val_overlap.csv")
    with pytest.raises(TaskFileError, match=r"val_overlap\.csv.*task id '35' is also in train\.csv"):
        import_long(tmp_path / "train.csv", spec.model_copy(update={"val_file": tmp_path / "val_overlap.csv"}))
    embedllm_like(range(50, 60), models[:2]).write_csv(tmp_path / "test_two.csv")
    with pytest.raises(TaskFileError, match=r"test_two\.csv.*workers differ from train\.csv's \(missing \['google/gemma-7b'\]"):
        import_long(tmp_path / "train.csv", spec.model_copy(update={"test_file": tmp_path / "test_two.csv"}))
    rows, _ = import_long(tmp_path / "train.csv", spec.model_copy(update={"test_file": tmp_path / "test_two.csv",
                                                                          "workers": models[:2]}))
    assert rows[-1].split == "test" and rows[-1].worker_ids == models[:2]
    with pytest.raises(TaskFileError, match="the same file is named for two splits"):
        import_long(tmp_path / "train.csv", spec.model_copy(update={"test_file": tmp_path / "val.csv"}))
    with pytest.raises(ValueError, match="give the splits by file"):
        LongSpec(test_file=tmp_path / "test.csv", test_fraction=0.2)
    # a wide table takes a file per split the same way; and so does the command line
    wide = routerbench_like(30)
    wide.head(20).write_parquet(tmp_path / "w_train.parquet")
    wide.tail(10).write_parquet(tmp_path / "w_test.parquet")
    rows, _ = import_table(tmp_path / "w_train.parquet", SPEC.model_copy(update={"test_file": tmp_path / "w_test.parquet"}))
    assert [r.split for r in rows] == ["train"] * 20 + ["test"] * 10
    monkeypatch.chdir(tmp_path)
    assert main(["import", "long", "train.csv", "--val-file", "val.csv", "--test-file", "test.csv", "--output", "e.jsonl",
                 "--worker-column", "model_name", "--score-column", "label", "--id-column", "prompt_id",
                 "--domain-column", "category"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 60 and summary["files"]["val.csv"]["split"] == "val"


def test_data_without_costs_trains_and_evaluates_without_a_budget_section(tmp_path, monkeypatch, capsys):
    """An import without a cost column holds cost 0 for every call: there is nothing to budget. The
    report used to print every worker at share 0 against a '$1000 per 1,000' reference."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    melt(routerbench_like(150)).drop("cost").write_parquet(tmp_path / "calls.parquet")
    assert main(["import", "long", "calls.parquet", "--output", "r.jsonl", "--id-column", "sample_id",
                 "--domain-column", "eval_name"]) == 0
    capsys.readouterr()
    common = ["--data", "r.jsonl", "--workers", "configs/reward.quality.yaml", "--encoder", "tiny"]
    assert main(["train", *common, "--output", "models", "--layer-sets", "off"]) == 0
    out, err = capsys.readouterr()
    assert "budget mode: not available for this checkpoint (this data records no cost per call" in err
    assert not list((tmp_path / "models").glob("*/*/budget.json"))
    chosen = out.strip().splitlines()[-1]
    assert main(["evaluate", "--checkpoint", chosen, *common]) == 0
    out, _ = capsys.readouterr()
    assert "router" in out and "budget:" not in out
    assert main(["evaluate", "--checkpoint", chosen, *common, "--budget-share", "0.5"]) == 2
    assert "records no cost per call, so there is nothing to budget" in capsys.readouterr().err


def test_a_table_given_where_a_reward_jsonl_belongs_is_refused_at_once_with_the_import_commands(tmp_path, monkeypatch, capsys):
    """`train --data calls.parquet` died in a UnicodeDecodeError traceback; a CSV listed every line
    as bad JSON. Each now gets one line naming the file and the import command. A CRLF or gzipped
    JSONL still reads."""
    import gzip

    from fugu_pipeline.matrix.import_format import read_reward_jsonl

    monkeypatch.chdir(tmp_path)
    long = melt(routerbench_like(9))
    long.write_parquet(tmp_path / "calls.parquet")
    long.write_csv(tmp_path / "calls.csv")
    (tmp_path / "calls.jsonl").write_bytes((tmp_path / "calls.parquet").read_bytes())  # binary, misnamed
    (tmp_path / "header.jsonl").write_bytes((tmp_path / "calls.csv").read_bytes())  # a CSV, misnamed
    for name, needle in (("calls.parquet", "calls.parquet: a .parquet table"), ("calls.csv", "calls.csv: a .csv table"),
                         ("calls.jsonl", "calls.jsonl:1: not UTF-8 text"), ("header.jsonl", "header.jsonl:1: not a JSON object")):
        with pytest.raises(TaskFileError) as err:
            read_reward_jsonl(tmp_path / name)
        assert needle in str(err.value) and "fugu-lite import long" in str(err.value), name
        assert str(err.value).count("\n") <= 2, name  # one problem, not a line per row
    rows_in = [{"task_id": f"t{i}", "prompt": f"p{i}\u0085x", "worker_ids": ["a", "b"], "rewards": [1, 0]} for i in range(3)]
    text = "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows_in) + "\r\n"
    (tmp_path / "crlf.jsonl").write_text(text, encoding="utf-8", newline="")
    (tmp_path / "crlf.jsonl.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    for name in ("crlf.jsonl", "crlf.jsonl.gz"):
        rows = read_reward_jsonl(tmp_path / name)
        assert [r.prompt for r in rows] == [f"p{i}\u0085x" for i in range(3)], name
    capsys.readouterr()
    assert main(["train", "--data", "calls.parquet", "--workers", str(REPO / "configs" / "reward.quality.yaml"),
                 "--encoder", "tiny", "--output", "m"]) == 2
    err = capsys.readouterr().err
    assert "a .parquet table" in err and "Traceback" not in err


def test_a_judges_scale_is_mapped_onto_quality(tmp_path):
    """MT-Bench-style judge scores in 1-10: `score_range` maps them linearly onto [0, 1]; a score
    outside the stated scale is refused with its rows."""
    long = melt(routerbench_like(12)).with_columns((pl.col("score") * 9 + 1).alias("score"))  # 0/1 -> 1/10
    long = _set(long, "score", [2], 5.5)
    long.write_parquet(tmp_path / "j.parquet")
    rows, _ = import_long(tmp_path / "j.parquet", LONG.model_copy(update={"score_range": (1, 10)}))
    assert rows[0].quality == [1.0, 0.5, 0.0]
    _refused(tmp_path, _set(long, "score", [7], 11.0), LONG.model_copy(update={"score_range": (1, 10)}),
             "column 'score': scores outside --score-range [1, 10] in rows 7 (e.g. 11.0)")
    with pytest.raises(ValueError, match="the lowest possible score, then the highest"):
        LongSpec(score_range=(10, 1))
    wide = routerbench_like(12).with_columns([(pl.col(m) * 4 + 1).alias(m) for m in MODELS])  # a 1-5 scale
    wide.write_parquet(tmp_path / "w.parquet")
    rows, _ = import_table(tmp_path / "w.parquet", SPEC.model_copy(update={"score_range": (1, 5)}))
    assert rows[0].quality == [1.0, 0.0, 0.0]


def test_a_call_log_of_conversations_is_routed_on_the_text_serve_routes_on(tmp_path):
    """A log keeps each call's `messages` (OpenAI's chat format). The prompt becomes the last user
    message, through the very function the server routes a request with; text parts count, a
    system message and the assistant's turns do not. A list of strings (a conversation's turns)
    gives its first turn."""
    from fugu_pipeline.serve.protocol import parse_chat_request

    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "What is 2+2?"}]
    rows = []
    for i in range(6):
        msgs = [dict(m) for m in convo]
        msgs[-1]["content"] = f"What is {i}+2?"
        for j, m in enumerate(["a", "b"]):
            rows.append({"call": i, "model": m, "score": float((i + j) % 2), "messages": msgs, "turns": [f"turn one {i}", "two"]})
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    got, _ = import_long(log, LongSpec(id_column="call", prompt_column="messages"))
    served = parse_chat_request(json.dumps({"model": "fugu", "messages": rows[0]["messages"]}).encode()).text
    assert got[0].prompt == served == "What is 0+2?"
    turns, _ = import_long(log, LongSpec(id_column="call", prompt_column="turns"))
    assert turns[3].prompt == "turn one 3"
    (tmp_path / "odd.jsonl").write_text(json.dumps({"call": 1, "model": "a", "score": 1, "messages": [[1, 2]]}) + "\n")
    with pytest.raises(TaskFileError, match="holds List"):
        import_long(tmp_path / "odd.jsonl", LongSpec(id_column="call", prompt_column="messages"))


def test_real_mt_bench_judgements_import_as_a_long_table(tmp_path):
    """RouteLLM's MT-Bench data as shipped: one GPT-4 judgement (1-10) per (question, model, turn),
    the questions (with their turns) in a second file. Both turns of a conversation average into
    its quality, on the scale mapped onto [0, 1]."""
    from fugu_pipeline_tests.test_importers import ROUTING, need

    folder = need(ROUTING / "routellm_evals")
    spec = LongSpec(worker_column="model", score_column="score", id_column="question_id", prompt_column="turns",
                    domain_column="category", prompts=folder / "mt_bench_question.jsonl", score_range=(1, 10),
                    duplicates="mean")
    rows, notes = import_long(folder / "mt_bench_judgements.jsonl.gz", spec)
    assert len(rows) == 80 and notes["pairs_averaged"] == 160 and notes["prompts_without_responses"] == 0
    assert rows[0].worker_ids == ["gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"]
    judged = [json.loads(x) for x in gzip.decompress((folder / "mt_bench_judgements.jsonl.gz").read_bytes()).decode().split("\n") if x]
    q81 = next(r for r in rows if r.task_id == "81")
    want = [sum((j["score"] - 1) / 9 for j in judged if j["question_id"] == 81 and j["model"] == m) / 2 for m in q81.worker_ids]
    assert q81.quality == pytest.approx(want) and q81.domain == "writing"
    assert q81.prompt.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert {r.domain for r in rows} == {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def test_a_log_where_each_prompt_went_to_one_worker_is_told_what_a_router_needs(tmp_path):
    """A production log routes each prompt to one worker: no prompt has every worker's score. The
    import says so and what to do (replay the prompts to every worker), instead of 'pass
    --drop-incomplete' and then 'no task has a score from every worker'."""
    long = melt(routerbench_like(30))
    one_each = long.filter(pl.int_range(pl.len()) % 3 == (pl.int_range(pl.len()) // 3) % 3)  # task i -> worker i % 3
    for drop in (False, True):
        _refused(tmp_path, one_each, LONG.model_copy(update={"drop_incomplete": drop}),
                 "only 0 of 30 tasks have a score from every one of the 3 workers (a task has 1 on median)",
                 "replay its prompts to every worker")


def test_columns_and_workers_named_like_the_importers_own_do_not_clash(tmp_path):
    """A worker called `key`, a file with columns `key`, `worker`, `score`, `cost`: the importer's
    own columns are its own."""
    rows = [{"key": f"k{i}", "worker": ["key", "score"][j], "score": float((i + j) % 2), "cost": 0.5 * j,
             "prompt": f"q{i}"} for i in range(8) for j in range(2)]
    pl.DataFrame(rows).write_parquet(tmp_path / "c.parquet")
    got, _ = import_long(tmp_path / "c.parquet", LongSpec(id_column="key", worker_column="worker", cost_column="cost"))
    assert got[1].worker_ids == ["key", "score"] and got[1].quality == [1.0, 0.0] and got[1].cost_usd == [0.0, 0.5]
    assert [r.task_id for r in got] == [f"k{i}" for i in range(8)]
