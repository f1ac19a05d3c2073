"""The wide (`import table`) and long (`import long`) importers keep each worker's reply where the
file has one (an optional column), so a cascade can read it; a bad reply is one line naming the
file, the column and the data row, and nothing is written."""

from __future__ import annotations

import json

import polars as pl
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.matrix.import_long import LongSpec, import_long
from fugu_pipeline.matrix.import_table import TableSpec, import_table
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline_tests.test_import_table import MODELS, SPEC, routerbench_like

ANSWERS = SPEC.model_copy(update={"answer_column": "{worker}|model_response"})


def _wide(n: int = 30) -> pl.DataFrame:
    df = routerbench_like(n)
    return df.with_columns(*[pl.lit(f"{m} says ").add(pl.col("sample_id")).alias(f"{m}|model_response") for m in MODELS])


def test_a_wide_table_keeps_each_worker_s_reply_in_every_format(tmp_path):
    df = _wide()
    for name, write in (("w.parquet", df.write_parquet), ("w.csv", df.write_csv), ("w.jsonl", df.write_ndjson)):
        write(tmp_path / name)
        rows, notes = import_table(tmp_path / name, ANSWERS)
        assert rows[4].answers == [f"{m} says {rows[4].task_id}" for m in MODELS], name
        assert rows[4].worker_ids == MODELS and not any("model_response" in c for c in notes.get("columns_not_read", []))
    # without the option the replies stay unread, as before
    plain, notes = import_table(tmp_path / "w.parquet", SPEC)
    assert plain[0].answers is None and "WizardLM/WizardLM-13B-V1.2|model_response" in notes["columns_not_read"]
    # a numeric final answer is kept as its text; an empty cell is an unknown reply
    nums = df.with_columns(pl.Series("gpt-4-1106-preview|model_response", [float(i) if i % 2 else None for i in range(30)]))
    nums.write_parquet(tmp_path / "n.parquet")
    rows, _ = import_table(tmp_path / "n.parquet", ANSWERS)
    assert rows[1].answers[2] == "1.0" and rows[0].answers[2] is None


def test_a_long_table_keeps_each_call_s_reply(tmp_path):
    df = _wide()
    long = pl.concat([df.select("sample_id", "prompt", "eval_name", pl.lit(m).alias("model"), pl.col(m).alias("score"),
                                pl.col(f"{m}|model_response").alias("response")) for m in MODELS])
    spec = LongSpec(id_column="sample_id", domain_column="eval_name", answer_column="response")
    for name, write in (("l.parquet", long.write_parquet), ("l.csv", long.write_csv)):
        write(tmp_path / name)
        rows, _ = import_long(tmp_path / name, spec)
        assert len(rows) == 30 and all(r.answers == [f"{m} says {r.task_id}" for m in sorted(MODELS)] for r in rows), name
    # repeated samples averaged: the first sample's reply is kept
    twice = pl.concat([long, long.with_columns(pl.lit("second").alias("response"))])
    twice.write_parquet(tmp_path / "twice.parquet")
    rows, notes = import_long(tmp_path / "twice.parquet", spec.model_copy(update={"duplicates": "mean"}))
    assert notes["pairs_averaged"] == 90 and "second" not in {a for r in rows for a in r.answers}


def test_a_bad_reply_is_named_by_column_and_row_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    df = _wide(12)
    bad = df.with_columns(pl.Series("claude-instant-v1|model_response", [["a", "list"] if i == 4 else None for i in range(12)]))
    bad.write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(TaskFileError, match=r"column 'claude-instant-v1\|model_response'.*holds List.*rows 5"):
        import_table(tmp_path / "bad.parquet", ANSWERS)
    huge = df.with_columns(pl.Series("gpt-4-1106-preview|model_response", ["x" * 1_000_001 if i == 7 else "ok" for i in range(12)]))
    huge.write_parquet(tmp_path / "huge.parquet")
    with pytest.raises(TaskFileError, match=r"more than 1,000,000 characters in rows 8"):
        import_table(tmp_path / "huge.parquet", ANSWERS)
    with pytest.raises(TaskFileError, match=r"no answer column 'WizardLM/WizardLM-13B-V1.2\|reply'"):
        import_table(tmp_path / "bad.parquet", SPEC.model_copy(update={"answer_column": "{worker}|reply"}))
    with pytest.raises(ValueError, match="must contain {worker}"):
        TableSpec(answer_column="model_response")
    long = pl.DataFrame({"prompt": ["p1", "p1", "p2", "p2"], "model": ["a", "b", "a", "b"], "score": [1.0, 0.0, 1.0, 1.0],
                         "response": [{"x": 1}, {"x": 2}, None, {"x": 3}]})
    long.write_parquet(tmp_path / "l.parquet")
    with pytest.raises(TaskFileError, match=r"column 'response'.*rows 1, 2, 4"):
        import_long(tmp_path / "l.parquet", LongSpec(answer_column="response"))
    # from the command line: one line, and no output file
    monkeypatch.chdir(tmp_path)
    assert main(["import", "table", "bad.parquet", "--output", "r.jsonl", "--id-column", "sample_id",
                 "--domain-column", "eval_name", "--cost-column", "{worker}|total_cost",
                 "--answer-column", "{worker}|model_response"]) == 2
    err = capsys.readouterr().err.strip()
    assert "rows 5" in err and len(err.splitlines()) == 1 and not (tmp_path / "r.jsonl").exists()
    _wide(12).write_csv(tmp_path / "good.csv")
    assert main(["import", "table", "good.csv", "--output", "r.jsonl", "--id-column", "sample_id", "--domain-column",
                 "eval_name", "--cost-column", "{worker}|total_cost", "--answer-column", "{worker}|model_response"]) == 0
    first = json.loads((tmp_path / "r.jsonl").read_text(encoding="utf-8").split("\n")[0])
    assert first["answers"] == [f"{m} says {first['task_id']}" for m in MODELS]
