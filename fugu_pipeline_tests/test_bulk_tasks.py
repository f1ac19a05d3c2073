"""The matrix build reads batch files in bulk (DuckDB), checking in SQL only what SQL can vouch for
and leaving every other line to the Python reader. Whatever a line holds, both must agree: the same
tasks kept (same fields, prompt hashes, line numbers), the same batches refused with the same
messages. Each odd line below is put in a batch of its own beside a sound task."""

import json
from pathlib import Path

import duckdb
import pytest

from fugu_pipeline.matrix.bulk_tasks import GRADER_FIELDS, TASKS_TABLE, read_batches
from fugu_pipeline.tasks.loading import TaskFileError, load_all_batches, read_batch
from fugu_pipeline.tasks.schema import ContainsGrader, ExactGrader, LLMJudgeGrader, NumericGrader

GOOD = {"task_id": "g1", "prompt": "What is 2 + 2?", "reference_answer": "4", "grader": {"type": "numeric"}}
ODD_LINES = [
    # sound in both readers, through SQL
    json.dumps({"task_id": "a", "prompt": "Name a colour.", "reference_answer": "blue", "grader": {"type": "exact", "case_sensitive": True}}),
    json.dumps({"task_id": "b", "prompt": "p", "domain": "code", "split": "test", "tags": ["x", "y"],
                "reference_answer": "z", "grader": {"type": "contains"}}),
    json.dumps({"task_id": "c", "prompt": "Rate this.", "reference_answer": None, "grader": {"type": "llm_judge", "rubric": "r", "scale": 5}}),
    json.dumps({"task_id": "d", "prompt": "Tolerance", "reference_answer": "3.5", "grader": {"type": "numeric", "tolerance": 0.5, "relative": False}}),
    json.dumps({"task_id": "e", "prompt": "caf\u00e9 \u2028 \u0085 \U0001f600", "reference_answer": "x", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "e2", "prompt": "café 😀", "reference_answer": "x", "grader": {"type": "exact"}}, ensure_ascii=False),
    '{"task_id":"f","prompt":"esc \\" \\\\ \\/ \\n \\t \\u00e9","reference_answer":"q","grader":{"type":"exact"}}',
    '  {"task_id": "g", "prompt": "spaces around", "reference_answer": "1", "grader": {"type": "numeric"}}  \r',
    '{"task\\u005fid": "h", "prompt": "an escaped key", "reference_answer": "1", "grader": {"type": "numeric"}}',
    json.dumps({"task_id": "i", "prompt": "The answer is 42 apples", "reference_answer": "4", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "i2", "prompt": "answer  is  4 (two spaces)", "reference_answer": "42", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "i3", "prompt": "ANSWER:\t7 here", "reference_answer": "8", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "t" * 256, "prompt": "longest id", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "j", "prompt": "x", "reference_answer": "Ⅻ", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "j2", "prompt": "Solve.", "reference_answer": "1/2", "grader": {"type": "exact", "math": True}}),
    json.dumps({"task_id": "j3", "prompt": "Sum.", "reference_answer": "12", "grader": {"type": "numeric", "tolerance": 0.0, "math": False}}),
    # sound in Python only (SQL leaves them to it)
    json.dumps({"task_id": "k", "prompt": "p", "reference_answer": 7, "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "k2", "prompt": "p", "reference_answer": 7.25, "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "l", "prompt": "p", "reference_answer": "a+", "grader": {"type": "regex"}}),
    json.dumps({"task_id": "m", "prompt": "p", "reference_answer": "x", "grader": {"type": "exact", "strip": 1}}),
    json.dumps({"task_id": "n", "prompt": "p", "reference_answer": "x", "grader": {"type": "llm_judge", "rubric": "r", "scale": 5.0}}),
    '{"task_id": "o", "prompt": "NaN tolerance", "reference_answer": "1", "grader": {"type": "numeric", "tolerance": NaN}}',
    json.dumps({"task_id": "p", "prompt": "lone \ud800 surrogate", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "q", "prompt": "a NUL \u0000 inside", "reference_answer": "1", "grader": {"type": "numeric"}}),
    '{"task_id": "r", "prompt": "twice", "prompt": "second wins", "reference_answer": "1", "grader": {"type": "numeric"}}',
    json.dumps({"task_id": "s", "prompt": "\u00a0", "reference_answer": "\u00a0x\u00a0", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "s2", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric", "math": 1}}),
    json.dumps({"task_id": "s3", "prompt": "Echo it: 3", "reference_answer": "3", "grader": {"type": "io_tests", "mode": "stdin",
                                                                                       "tests": [{"input": "3", "output": "3"}]}}),
    # refused by both
    '{"task_id": "u", "prompt": "trailing comma", "reference_answer": "1", "grader": {"type": "numeric"},}',
    '{"task_id": "v", "prompt": "tab\tinside", "reference_answer": "1", "grader": {"type": "numeric"}}',
    '{"task_id": "w", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric", "tolerance": inf}}',
    '{"task_id": "w2", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric", "tolerance": -0.5}}',
    json.dumps({"task_id": "x", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric"}, "extra": 1}),
    json.dumps({"task_id": "x2", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric", "extra": 1}}),
    json.dumps({"task_id": "y", "prompt": "p", "reference_answer": "one", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "y2", "prompt": "p", "reference_answer": "  ", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "y3", "prompt": "p", "reference_answer": "\u00a0", "grader": {"type": "contains"}}),
    json.dumps({"task_id": "z", "prompt": "the secret answer is forty-two", "reference_answer": "forty-two", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "z2", "prompt": "so the answer: 7.", "reference_answer": "7", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "z3", "prompt": "so the answer  =\n 7", "reference_answer": "7", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "z4", "prompt": "ÜBER the answer is ü", "reference_answer": "Ü", "grader": {"type": "exact"}}),
    json.dumps({"task_id": "", "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "t" * 257, "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "aa", "prompt": "", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "ab", "prompt": "p", "domain": None, "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "ac", "prompt": "p", "split": "dev", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "ad", "prompt": "p", "tags": ["a", 1], "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "ae", "prompt": "p", "tags": None, "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": 5, "prompt": "p", "reference_answer": "1", "grader": {"type": "numeric"}}),
    json.dumps({"task_id": "af", "prompt": "p", "reference_answer": "1", "grader": "numeric"}),
    json.dumps({"task_id": "ag", "prompt": "p", "reference_answer": "1", "grader": {"type": "telepathy"}}),
    json.dumps({"task_id": "ah", "prompt": "p", "grader": {"type": "llm_judge", "rubric": ""}}),
    json.dumps({"task_id": "ai", "prompt": "p", "grader": {"type": "llm_judge", "rubric": "r", "scale": 0}}),
    json.dumps({"task_id": "aj", "prompt": "p", "reference_answer": "1", "grader": {"type": "exact", "case_sensitive": None}}),
    json.dumps({"task_id": "aj2", "prompt": "p", "reference_answer": "1", "grader": {"type": "exact", "math": None}}),
    json.dumps({"task_id": "aj3", "prompt": "p", "reference_answer": "1", "grader": {"type": "contains", "math": True}}),
    json.dumps([1, 2]),
    "not json at all",
    '{"task_id": "ak", "prompt": "p"',
    '\ufeff{"task_id": "al", "prompt": "a BOM on line 2", "reference_answer": "1", "grader": {"type": "numeric"}}',
]


def readers_agree(folder: Path) -> tuple[list, list[str]]:
    py_refused: list[TaskFileError] = []
    py = sorted((b, t.task_id, t.prompt, t.domain, t.split, t.grader.type, list(t.tags), t.prompt_hash)
                for b, t in load_all_batches(folder, py_refused))
    bulk_refused: list[TaskFileError] = []
    with duckdb.connect() as con:
        con.execute(TASKS_TABLE)
        read_batches(con, folder, (), bulk_refused)
        bulk = sorted(con.execute("SELECT batch, task_id, prompt, domain, split, grader_type, tags, prompt_hash "
                                  "FROM tasks").fetchall())
    assert bulk == [tuple(x) for x in py]
    assert sorted(str(e) for e in bulk_refused) == sorted(str(e) for e in py_refused)
    return py, sorted(str(e) for e in py_refused)


@pytest.mark.parametrize("k", range(len(ODD_LINES)))
def test_an_odd_line_reads_the_same_in_bulk_as_in_python(tmp_path, k):
    (tmp_path / "b.jsonl").write_text(json.dumps(GOOD) + "\n" + ODD_LINES[k] + "\n", encoding="utf-8")
    readers_agree(tmp_path)


def test_all_odd_lines_together_and_line_numbers(tmp_path, monkeypatch):
    """Every line SQL vouches for in one file, blank and whitespace-only lines between them: SQL
    takes the whole file (the Python reader is not asked), and the line numbers a clash names are
    the Python reader's."""
    import fugu_pipeline.matrix.bulk_tasks as bulk_tasks

    lines = [json.dumps(GOOD), "", "   "]
    for line in ODD_LINES[:16]:
        lines += [line, "\t"]
    (tmp_path / "a.jsonl").write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    asked = []
    monkeypatch.setattr(bulk_tasks, "read_batch", lambda path: asked.append(path) or read_batch(path))
    kept, refused = readers_agree(tmp_path)
    assert not refused and len(kept) == 17 and asked == []
    monkeypatch.undo()
    at = {t.task_id: line for line, t in read_batch(tmp_path / "a.jsonl")}
    (tmp_path / "z.jsonl").write_text(json.dumps({**GOOD, "task_id": "i", "prompt": "other"}) + "\n", encoding="utf-8")
    _, refused = readers_agree(tmp_path)
    assert f"z.jsonl:1: task_id 'i' is also in batch 'a' (a.jsonl:{at['i']}) with another prompt" in refused[0]


def test_files_python_cannot_decode_or_that_hold_nothing(tmp_path):
    (tmp_path / "bin.jsonl").write_bytes(b'{"task_id": "x", "prompt": "\xff\xfe"}\n')
    (tmp_path / "empty.jsonl").write_text("\n \n", encoding="utf-8")
    (tmp_path / "ok.jsonl").write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    kept, refused = readers_agree(tmp_path)
    assert [k[0] for k in kept] == ["ok"] and len(refused) == 2


def test_sql_checks_only_fields_the_graders_have():
    """The grader fields SQL vouches for are the models' own: a renamed field cannot be let through."""
    models = {"exact": ExactGrader, "contains": ContainsGrader, "numeric": NumericGrader, "llm_judge": LLMJudgeGrader}
    for kind, fields in GRADER_FIELDS.items():
        assert set(fields) <= set(models[kind].model_fields), kind
