"""Convert public benchmark files into BenchGen batch files (one `Task` JSON object per line).

    fugu-lite convert KIND DATA_PATH --out data/benchgen/KIND.jsonl [--limit N] [--split-seed 0]
        [--test-fraction 0.3] [--val-fraction 0.1] [--strict]

KIND: math500, gsm8k, svamp, aime24, amc23, minerva_math, mmlu_stem, mmlu, humaneval, livecodebench.
DATA_PATH is the source file (.jsonl or .jsonl.gz) or a folder holding it under its usual name
(`SOURCES`). Task ids are `<kind>-<row index>`; the split comes from a hash of (seed, task_id).
Every row is validated with the package's `Task` schema; a row that fails is reported with its file
and line and counted, never silently dropped. Math rows get `numeric`/`exact` graders with
`math: true` (equivalence by math-verify when the plain comparison fails). HumanEval rows use the
`python_tests` grader and LiveCodeBench rows the `io_tests` grader (public test cases), both in
the sandbox. `mmlu` is the full MMLU with the subject as domain (`benchmark_rows.py`).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fugu_pipeline.files import atomic_write
from fugu_pipeline.tasks.answers import last_boxed
from fugu_pipeline.tasks.benchmark_rows import livecodebench, mcq, mmlu, subject_of
from fugu_pipeline.tasks.references import MATH_INSTRUCTION, choice_grader, format_number, math_reference
from fugu_pipeline.tasks.schema import Task

CODE_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, imports "
    "included, in one fenced Python code block.\n\n"
)


Row = dict[str, Any]
RowConverter = Callable[[Row], dict[str, Any]]


def _text(row: Row, key: str) -> str:
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"field {key!r} is missing or empty")
    return v


def _number(row: Row, key: str) -> str:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"field {key!r} is missing or not a number: {v!r}")
    if isinstance(v, str):
        ref, grader = math_reference(v)
        if grader["type"] != "numeric":
            raise ValueError(f"field {key!r} is not a plain number: {v!r}")
        return ref
    return format_number(v)


def _math(problem: str, answer: str, tags: list[str]) -> dict[str, Any]:
    ref, grader = math_reference(answer)
    return {
        "prompt": problem.strip() + MATH_INSTRUCTION,
        "domain": "math",
        "reference_answer": ref,
        "grader": grader,
        "tags": tags,
    }


def math500(row: Row) -> dict[str, Any]:
    return _math(
        _text(row, "problem"),
        _text(row, "answer"),
        [f"subject:{row.get('subject')}", f"level:{row.get('level')}", f"source_id:{row.get('unique_id')}"],
    )


def gsm8k(row: Row) -> dict[str, Any]:
    solution = _text(row, "answer")
    if "####" not in solution:
        raise ValueError("answer has no '#### <number>' line")
    ref = solution.rsplit("####", 1)[1].strip()
    task = _math(_text(row, "question"), ref, [])
    if task["grader"]["type"] != "numeric":
        raise ValueError(f"final answer is not a plain number: {ref!r}")
    return task


def svamp(row: Row) -> dict[str, Any]:
    body, question = _text(row, "Body").strip(), _text(row, "Question").strip()
    text = f"{body} {question}" if body[-1] in ".?!" else f"{body}, {question[0].lower()}{question[1:]}"
    return {
        "prompt": text + MATH_INSTRUCTION,
        "domain": "math",
        "reference_answer": _number(row, "Answer"),
        "grader": {"type": "numeric", "tolerance": 0.0, "math": True},
        "tags": [f"type:{row.get('Type')}"],
    }


def competition(row: Row) -> dict[str, Any]:
    """aime24 / amc23: integer answers."""
    return {
        "prompt": _text(row, "problem").strip() + MATH_INSTRUCTION,
        "domain": "math",
        "reference_answer": _number(row, "answer"),
        "grader": {"type": "numeric", "tolerance": 0.0, "math": True},
        "tags": [f"url:{row.get('url')}"] if row.get("url") else [],
    }


def minerva_math(row: Row) -> dict[str, Any]:
    answer = last_boxed(_text(row, "solution"))
    if not answer:
        raise ValueError("solution has no (balanced) \\boxed{} answer")
    return _math(_text(row, "problem"), answer, [f"course:{row.get('type')}"])


def mmlu_stem(row: Row) -> dict[str, Any]:
    """The STEM subset (Qwen2.5-Math's copy), one domain `stem`; the subject is a tag. See `mmlu`
    for all 57 subjects with the subject as domain."""
    prompt, letter = mcq(row)
    return {
        "prompt": prompt,
        "domain": "stem",
        "reference_answer": letter,
        "grader": choice_grader(letter),
        "tags": [f"subject:{subject_of(row, known=False)}"],
    }


def humaneval(row: Row) -> dict[str, Any]:
    stub, entry = _text(row, "prompt"), _text(row, "entry_point")
    if "```" in stub:
        raise ValueError("prompt contains a code fence")
    grader = {
        "type": "python_tests",
        "test": _text(row, "test"),
        "entry_point": entry,
        "timeout_s": 10,
        "memory_mb": 512,
    }
    return {
        "prompt": f"{CODE_INSTRUCTION}```python\n{stub}```",
        "domain": "code",
        "reference_answer": stub + _text(row, "canonical_solution"),
        "grader": grader,
        "tags": [f"source_id:{row.get('task_id')}", f"entry_point:{entry}"],
    }


@dataclass(frozen=True)
class Source:
    path: str  # usual location under the shared data folder
    convert: RowConverter


SOURCES: dict[str, Source] = {
    "math500": Source("math500/test.jsonl.gz", math500),
    "gsm8k": Source("qwen25math_eval/gsm8k_test.jsonl.gz", gsm8k),
    "svamp": Source("qwen25math_eval/svamp_test.jsonl.gz", svamp),
    "aime24": Source("qwen25math_eval/aime24_test.jsonl.gz", competition),
    "amc23": Source("qwen25math_eval/amc23_test.jsonl.gz", competition),
    "minerva_math": Source("qwen25math_eval/minerva_math_test.jsonl.gz", minerva_math),
    "mmlu_stem": Source("qwen25math_eval/mmlu_stem_test.jsonl.gz", mmlu_stem),
    "mmlu": Source("mmlu/test.jsonl", mmlu),
    "humaneval": Source("humaneval/HumanEval.jsonl.gz", humaneval),
    "livecodebench": Source("livecodebench/test.jsonl", livecodebench),
}


@dataclass
class Report:
    """What a conversion did: rows read and written (per split and grader) and every skipped row."""

    kind: str
    path: Path
    rows: int = 0
    by_split: Counter = field(default_factory=Counter)
    by_grader: Counter = field(default_factory=Counter)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, task id, reason)

    @property
    def written(self) -> int:
        return sum(self.by_split.values())

    def summary(self) -> str:
        lines = [
            f"{self.kind}: {self.path}: {self.rows} rows read, {self.written} written, {len(self.skipped)} skipped",
            "  per split:  " + ", ".join(f"{k} {v}" for k, v in sorted(self.by_split.items())),
            "  per grader: " + ", ".join(f"{k} {v}" for k, v in sorted(self.by_grader.items())),
        ]
        reasons = Counter(re.sub(r"\d+", "N", why)[:120] for _, _, why in self.skipped)
        lines += [f"  skipped ({n}): {why}" for why, n in reasons.most_common()]
        return "\n".join(lines)


def assign_split(task_id: str, seed: int = 0, test_fraction: float = 0.3, val_fraction: float = 0.1) -> str:
    """Deterministic split from (seed, task_id): a hash mapped to [0, 1)."""
    if test_fraction < 0 or val_fraction < 0 or test_fraction + val_fraction > 1:
        raise ValueError("fractions must be >= 0 and sum to at most 1")
    u = int.from_bytes(hashlib.sha256(f"{seed}:{task_id}".encode()).digest()[:8], "big") / 2**64
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def resolve_path(kind: str, data_path: str | Path) -> Path:
    """DATA_PATH itself when it is a file, else the source's usual path under it."""
    p = Path(data_path)
    if p.is_dir():
        for candidate in (p / SOURCES[kind].path, p / Path(SOURCES[kind].path).name):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"no {SOURCES[kind].path} under {p}")
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist")
    return p


def read_rows(path: Path) -> list[tuple[int, Row | None, str]]:
    """(line number, row or None, problem) for every non-blank line."""
    opener = gzip.open if path.name.endswith(".gz") else open
    out: list[tuple[int, Row | None, str]] = []
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                out.append((lineno, None, f"malformed JSON: {exc.msg}"))
                continue
            out.append((lineno, obj, "") if isinstance(obj, dict) else (lineno, None, "not a JSON object"))
    return out


def validate(task: dict[str, Any]) -> Task:
    """The package's `Task`, plus one check it leaves out: a regex grader's pattern must not match
    the prompt itself."""
    t = Task.model_validate(task)
    g = t.grader
    if g.type == "regex" and re.search(g.pattern or t.reference_answer or "", t.prompt):
        raise ValueError("the grader's regex matches the prompt itself")
    return t


def convert(
    kind: str,
    data_path: str | Path,
    *,
    limit: int | None = None,
    split_seed: int = 0,
    test_fraction: float = 0.3,
    val_fraction: float = 0.1,
) -> tuple[list[dict[str, Any]], Report]:
    """Convert one source file. Returns the task objects (JSON-ready) and the report."""
    if kind not in SOURCES:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(SOURCES)}")
    path = resolve_path(kind, data_path)
    report = Report(kind, path)
    tasks: list[dict[str, Any]] = []
    for index, (lineno, row, problem) in enumerate(read_rows(path)):
        if limit is not None and index >= limit:
            break
        report.rows += 1
        task_id = f"{kind}-{index}"
        try:
            if row is None:
                raise ValueError(problem)
            task = {"task_id": task_id, **SOURCES[kind].convert(row)}
            task["split"] = assign_split(task_id, split_seed, test_fraction, val_fraction)
            task["tags"] = [f"source:{kind}", *task.get("tags", [])]
            validate(task)
        except (ValueError, ValidationError) as exc:
            msg = (
                "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                if isinstance(exc, ValidationError)
                else str(exc)
            )
            report.skipped.append((lineno, task_id, msg))
            continue
        tasks.append(task)
        report.by_split[task["split"]] += 1
        report.by_grader[task["grader"]["type"]] += 1
    return tasks, report


def write_batch(tasks: list[dict[str, Any]], out: str | Path) -> None:
    """One JSON object per line (UTF-8), written to a temporary file then renamed into place."""
    atomic_write(out, "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The converter's flags (shared by `python -m fugu_pipeline.tasks.converters` and `fugu-lite convert`)."""
    ap.add_argument("kind", choices=sorted(SOURCES))
    ap.add_argument("data_path", help="the source file, or the folder holding humaneval/, math500/, qwen25math_eval/, "
                    "mmlu/, livecodebench/")
    ap.add_argument("--out", "--output", dest="out", required=True, help="the batch file to write, e.g. data/benchgen/math500.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--test-fraction", type=float, default=0.3)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--strict", action="store_true", help="write nothing and exit 1 if any row is bad")


def run(a: argparse.Namespace) -> int:
    """Convert, report every skipped row by file and line, write the batch atomically."""
    try:
        tasks, report = convert(
            a.kind,
            a.data_path,
            limit=a.limit,
            split_seed=a.split_seed,
            test_fraction=a.test_fraction,
            val_fraction=a.val_fraction,
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for lineno, task_id, reason in report.skipped:
        print(f"{report.path}:{lineno}: skipped {task_id}: {reason}", file=sys.stderr)
    if a.strict and report.skipped:
        print(report.summary() + "\nnothing written (--strict)", file=sys.stderr)
        return 1
    if not tasks:
        print(report.summary() + "\nnothing written: no valid rows", file=sys.stderr)
        return 1
    write_batch(tasks, a.out)
    print(report.summary() + f"\nwrote {len(tasks)} tasks to {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fugu_pipeline.tasks.converters", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
