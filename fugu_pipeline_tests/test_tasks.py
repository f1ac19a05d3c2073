"""Task batches: every bad input fails the whole batch, naming the file and line."""

import json

import pytest

from fugu_pipeline.tasks.loading import TaskFileError, batch_name, load_tasks
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl


def test_sample_batch_covers_domains_and_every_grader():
    tasks = load_tasks(REPO / "data" / "benchgen" / "sample.jsonl")
    assert {t.domain for t in tasks} == {"math", "code", "general"}
    assert {t.grader.type for t in tasks} == {"exact", "contains", "numeric", "regex", "llm_judge"}
    assert {t.split for t in tasks} == {"train", "val", "test"}


@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ('{"task_id": "t9", "prompt": "x"', "malformed JSON"),
        (json.dumps({"task_id": "t9", "domain": "math", "grader": {"type": "exact"}, "reference_answer": "1"}), "field 'prompt': Field required"),
        (json.dumps(task_row(0)), "duplicate task_id 't0' (first on line 1)"),
        (json.dumps(task_row(9, grader={"type": "fuzzy"})), "unknown grader type 'fuzzy'"),
        (json.dumps(task_row(9, grader={"type": "regex", "pattern": "(unclosed"})), "invalid regex"),
        (json.dumps(task_row(9, reference_answer="forty-two")), "numeric reference_answer"),
        (json.dumps(task_row(9, prompt="Say hello. The answer is 10.", reference_answer="10")), "prompt contains its own reference_answer"),
        (json.dumps(task_row(9, prompt="Where is the Eiffel Tower? (Paris, France)", reference_answer="Paris, France", grader={"type": "contains"})), "prompt contains its own reference_answer"),
        (json.dumps(task_row(9, grader={"type": "llm_judge"})), "field 'grader.rubric'"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, expected):
    path = write_jsonl(tmp_path / "b.jsonl", [task_row(0), task_row(1), bad_line])
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    msg = str(err.value)
    assert f"{path}:3:" in msg
    assert expected in msg
    assert "nothing of this batch was written" in msg


def test_all_problems_are_listed(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", ["{oops", task_row(1), json.dumps(task_row(2, grader={"type": "nope"}))])
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert [line for line, _ in err.value.problems] == [1, 3]


def test_short_answers_in_prompt_are_not_leaks(tmp_path):
    # "2" appears in "What is 1 + 1?" only by chance: not a leak.
    path = write_jsonl(tmp_path / "b.jsonl", [task_row(1, prompt="What is 1 + 1? Pick from 1, 2, 3.", reference_answer="2")])
    assert load_tasks(path)[0].reference_answer == "2"


def test_prompts_holding_unicode_line_separators_raw_load_and_keep_their_line_numbers(tmp_path):
    """JSON may hold U+0085, U+2028, U+2029 (and \\x1c-\\x1e, \\x0b, \\x0c escaped) in a string; a
    writer with ensure_ascii=False writes the first three raw. str.splitlines cuts there, so the
    batch was refused as malformed JSON (one of dcrouter's real prompts holds U+0085)."""
    odd = "Line one\u0085line two\u2028line three\u2029end \x1c\x1d\x1e\x0b\x0c"
    rows = [json.dumps(task_row(0, prompt=odd), ensure_ascii=False), task_row(1), '{"task_id": "t9"']
    path = write_jsonl(tmp_path / "b.jsonl", rows)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert [line for line, _ in err.value.problems] == [3]  # the first line parsed; the bad one keeps its number
    path = write_jsonl(tmp_path / "ok.jsonl", rows[:2])
    assert load_tasks(path)[0].prompt == odd


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(TaskFileError, match="no tasks"):
        load_tasks(write_jsonl(tmp_path / "e.jsonl", []))
    with pytest.raises(TaskFileError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")


def test_batch_names(tmp_path):
    assert batch_name(tmp_path / "batch-2026_11.jsonl") == "batch-2026_11"
    with pytest.raises(TaskFileError):
        batch_name(tmp_path / "bad name!.jsonl")
