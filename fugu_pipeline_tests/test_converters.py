"""Converters: counts match the sources, every task validates, references grade 1.0, wrong answers 0.0."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fugu_pipeline.collect.code_grader import grade_python_tests
from fugu_pipeline.collect.grading import grade_local
from fugu_pipeline.tasks.answers import extract_final_number, parse_number
from fugu_pipeline.tasks.converters import (
    SOURCES,
    assign_split,
    convert,
    main,
    validate,
    write_batch,
)
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.tasks.references import LETTERS
from fugu_pipeline.tasks.schema import Task

# Rows the package's Task schema refuses as leaks (the prompt holds the reference), by kind.
KNOWN_REFUSALS = {"math500": 1, "minerva_math": 3}
ROOT = Path(__file__).resolve().parent.parent


def _source_rows(path: Path) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


class _Converted(dict):
    """kind -> (tasks, report) for the sources present; a missing one skips its test with the reason."""

    def __init__(self, data_dir: Path):
        super().__init__()
        self.data_dir = data_dir

    def __missing__(self, kind: str):
        if not (self.data_dir / SOURCES[kind].path).is_file():
            pytest.skip(f"{SOURCES[kind].path} is not under {self.data_dir}: that source is downloaded by the "
                        "user (see the converters' docs), not shipped with the workspace's task data")
        self[kind] = convert(kind, self.data_dir)
        return self[kind]


@pytest.fixture(scope="module")
def converted(data_dir: Path) -> _Converted:
    return _Converted(data_dir)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_no_row_is_silently_lost(kind: str, converted: dict, data_dir: Path) -> None:
    tasks, report = converted[kind]
    source_rows = _source_rows(data_dir / SOURCES[kind].path)
    assert report.rows == source_rows
    assert report.written == len(tasks) and report.written + len(report.skipped) == source_rows
    assert len(report.skipped) == KNOWN_REFUSALS.get(kind, 0), report.summary()
    for lineno, task_id, reason in report.skipped:
        assert lineno >= 1 and task_id.startswith(kind) and "reference_answer" in reason
    print(f"\n{report.summary()}")


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_every_task_validates_and_ids_are_unique(kind: str, converted: dict) -> None:
    tasks, _ = converted[kind]
    ids = [t["task_id"] for t in tasks]
    assert len(set(ids)) == len(ids) and all(i.startswith(f"{kind}-") for i in ids)
    for t in tasks:
        assert Task.model_validate(t).task_id == t["task_id"]  # the package's own schema
        assert t["split"] == assign_split(t["task_id"]) and t["tags"][0] == f"source:{kind}"
        assert t["reference_answer"] not in t["prompt"] or len(t["reference_answer"]) < 6


def test_batches_load_with_the_package_loader(converted: dict, tmp_path: Path) -> None:
    for kind, (tasks, _) in converted.items():
        out = tmp_path / f"{kind}.jsonl"
        write_batch(tasks, out)
        assert len(load_tasks(out)) == len(tasks)


def _wrong_number(ref: str) -> str:
    x = parse_number(ref)
    return str(x + max(1.0, abs(x)))


def _brace_depth(s: str) -> int:
    depth = deepest = 0
    for c in s:
        depth += (c == "{") - (c == "}")
        deepest = max(deepest, depth)
    return deepest


def _answer_format(task: Task) -> tuple:
    """The kind of reference a row holds, as far as grading a wrong answer goes: the grader, LaTeX or
    plain, an equation or a value, nested braces or not."""
    ref = task.reference_answer or ""
    return task.grader.type, "\\" in ref, "=" in ref, _brace_depth(ref) > 1


def _wrong_answers_checked(tasks: list[Task]) -> set[int]:
    """The rows whose wrong answers are graded for a math-graded source: one row in eight of every
    answer format the source holds, the format's first row included (so a rare format is never
    left out)."""
    seen: Counter = Counter()
    chosen = set()
    for i, task in enumerate(tasks):
        fmt = _answer_format(task)
        if seen[fmt] % 8 == 0:
            chosen.add(i)
        seen[fmt] += 1
    return chosen


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in sorted(SOURCES) if k != "humaneval"])
def test_references_grade_one_and_wrong_answers_zero(kind: str, converted: dict) -> None:
    """Every row: the reference in a worker-like answer grades 1.0, a wrong one 0.0, with the
    package's own grade_local. A wrong answer to a math task is only ruled out by math-verify
    (SymPy in its own process, from 0.05 s to its time bound a decision), so for those one row in
    eight of each answer format is checked, the format's first row included (grader, LaTeX or plain,
    equation or value, nested braces; the case tables of the math-grading tests cover the variants);
    the plain graders check every row."""
    tasks, _ = converted[kind]
    tasks = [Task.model_validate(raw) for raw in tasks]
    checked = _wrong_answers_checked(tasks)
    nested = graded_wrong = 0
    for i, task in enumerate(tasks):
        ref, kind_ = task.reference_answer or "", task.grader.type
        if kind_ == "numeric":
            right, wrong = [f"Reasoning...\nSo the answer is \\boxed{{{ref}}}."], [f"\\boxed{{{_wrong_number(ref)}}}"]
            if "\\" not in ref:  # the package reads a bare LaTeX fraction as its last integer
                right += [ref, f"The answer is {ref}."]
        elif kind_ == "regex":
            other = LETTERS[(LETTERS.index(ref) + 1) % 4]
            right = [ref, f"({ref})", f"The answer is {ref}", f"\\boxed{{{ref}}}"]
            wrong = [other, f"The answer is ({other}).", task.prompt]
        else:
            # `{ref}x` is wrong for a value; for an equation "... = 0" it is not (0x = 0): change a side instead
            wrong = ["\\boxed{wrong}", f"\\boxed{{{ref} + 1}}" if "=" in ref else f"\\boxed{{{ref}x}}"]
            right = [ref]
            if _brace_depth(ref) <= 1:  # the package's \boxed{} reader handles one nesting level
                right.append(f"Working...\nThe final answer is $\\boxed{{{ref}}}$.")
            else:
                nested += 1
        for answer in right:
            assert grade_local(task, answer).quality == 1.0, (task.task_id, answer)
        if not getattr(task.grader, "math", False) or i in checked:
            graded_wrong += 1
            for answer in wrong:
                assert grade_local(task, answer).quality == 0.0, (task.task_id, answer)
    print(f"\n{kind}: {len(tasks)} rows checked ({graded_wrong} with wrong answers too); {nested} exact references nested "
          "too deep for boxed extraction")


def test_numeric_references_are_read_back_by_the_package(converted: dict) -> None:
    for kind in ("gsm8k", "svamp", "aime24", "amc23"):
        for t in converted[kind][0]:
            assert extract_final_number(f"\\boxed{{{t['reference_answer']}}}") == parse_number(t["reference_answer"])


def test_humaneval_references_pass_and_wrong_code_fails(converted: dict) -> None:
    tasks, _ = converted["humaneval"]
    rng = random.Random(0)
    wrong_sample = rng.sample(tasks, 20)

    def grade(t: dict) -> tuple[str, float, float, str]:
        g = t["grader"]
        right, detail = grade_python_tests(t["reference_answer"], g, t["prompt"])
        body = t["reference_answer"][len(t["prompt"].split("```python\n", 1)[1].rsplit("```", 1)[0]) :]
        body_q, _ = grade_python_tests(body, g, t["prompt"])
        return t["task_id"], right, body_q, detail

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(grade, tasks))
    assert [r for r in results if r[1] != 1.0 or r[2] != 1.0] == []
    for t in wrong_sample:
        wrong = f"```python\ndef {t['grader']['entry_point']}(*args, **kwargs):\n    return None\n```"
        assert grade_python_tests(wrong, t["grader"], t["prompt"])[0] == 0.0, t["task_id"]


def test_splits_are_deterministic_and_follow_the_fractions() -> None:
    ids = [f"x-{i}" for i in range(5000)]
    a = [assign_split(i, 0) for i in ids]
    assert a == [assign_split(i, 0) for i in ids] and a != [assign_split(i, 1) for i in ids]
    assert abs(a.count("test") / 5000 - 0.3) < 0.03 and abs(a.count("val") / 5000 - 0.1) < 0.02
    assert set(assign_split(i, 0, 0.0, 0.0) for i in ids) == {"train"}
    with pytest.raises(ValueError):
        assign_split("x", 0, 0.8, 0.3)


def _write_gz(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_bad_rows_are_reported_with_their_line(tmp_path: Path) -> None:
    good = {"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": 1, "type": "physics"}
    lines = [
        json.dumps(good),
        "{not json",
        "[1, 2]",
        json.dumps({**good, "answer": 7}),
        "",
        json.dumps({**good, "choices": ["a", ""]}),
        json.dumps({**good, "question": ""}),
        json.dumps(good),
    ]
    path = _write_gz(tmp_path / "mmlu.jsonl.gz", lines)
    tasks, report = convert("mmlu_stem", path)
    assert report.rows == 7 and len(tasks) == 2
    assert [(ln, tid) for ln, tid, _ in report.skipped] == [
        (2, "mmlu_stem-1"),
        (3, "mmlu_stem-2"),
        (4, "mmlu_stem-3"),
        (6, "mmlu_stem-4"),
        (7, "mmlu_stem-5"),
    ]
    assert [t["task_id"] for t in tasks] == ["mmlu_stem-0", "mmlu_stem-6"]
    reasons = " | ".join(r for _, _, r in report.skipped)
    for expected in ("malformed JSON", "not a JSON object", "not an index", "empty", "'question' is missing"):
        assert expected in reasons


def test_source_specific_problems_are_reported(tmp_path: Path) -> None:
    gsm = _write_gz(
        tmp_path / "g.jsonl.gz",
        [json.dumps({"question": "Q", "answer": "no marker"}), json.dumps({"question": "Q", "answer": "x #### seven"})],
    )
    assert [r for _, _, r in convert("gsm8k", gsm)[1].skipped] == [
        "answer has no '#### <number>' line",
        "final answer is not a plain number: 'seven'",
    ]
    minerva = _write_gz(tmp_path / "m.jsonl.gz", [json.dumps({"problem": "P", "solution": "no box", "type": "t"})])
    assert "no (balanced)" in convert("minerva_math", minerva)[1].skipped[0][2]
    leak = _write_gz(
        tmp_path / "l.jsonl.gz",
        [
            json.dumps(
                {"problem": "What is 123456 + 0?", "answer": "123456", "subject": "s", "level": 1, "unique_id": "u"}
            )
        ],
    )
    assert "reference_answer" in convert("math500", leak)[1].skipped[0][2]


def test_regex_grader_must_not_match_its_own_prompt() -> None:
    task = {
        "task_id": "t",
        "prompt": "The answer is B, obviously.",
        "reference_answer": "B",
        "grader": {"type": "regex", "pattern": "answer is B"},
    }
    with pytest.raises(ValueError, match="matches the prompt"):
        validate(task)


def test_cli_writes_a_batch_and_a_summary(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "gsm8k-small.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fugu_pipeline.tasks.converters",
            "gsm8k",
            str(data_dir),
            "--out",
            str(out),
            "--limit",
            "50",
            "--split-seed",
            "3",
            "--test-fraction",
            "0.2",
            "--val-fraction",
            "0.2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "50 rows read, 50 written, 0 skipped" in proc.stdout and "per grader: numeric 50" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 50 and all(r["split"] == assign_split(r["task_id"], 3, 0.2, 0.2) for r in rows)


def test_cli_strict_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_gz(tmp_path / "aime.jsonl.gz", [json.dumps({"problem": "P", "answer": "12"}), "{bad"])
    out = tmp_path / "b.jsonl"
    assert main(["aime24", str(path), "--out", str(out), "--strict"]) == 1 and not out.exists()
    assert f"{path}:2: skipped aime24-1: malformed JSON" in capsys.readouterr().err
    assert main(["aime24", str(path), "--out", str(out)]) == 0 and len(out.read_text().splitlines()) == 1
    assert main(["aime24", str(tmp_path / "missing"), "--out", str(out)]) == 2
