"""Row converters for two of TinyRouter's benchmarks, in their public formats (used by
`converters.py`):

- `mmlu`: the full MMLU (cais/mmlu: `question`, `subject`, `choices`, `answer` as an index; the
  Qwen2.5-Math copy names the subject `type`), every one of its 57 subjects, the subject as the
  task's domain. A row without a subject, or with one that is not an MMLU subject, is refused
  (never converted with domain "None").
- `livecodebench`: LiveCodeBench code generation (livecodebench/code_generation_lite:
  `question_title`, `question_content`, `platform`, `question_id`, `starter_code`, `difficulty`,
  `public_test_cases` as a JSON string of `{input, output, testtype}`, `metadata` as a JSON string
  with `func_name` for LeetCode-style problems). Graded by the public test cases in the sandbox
  (`io_tests`: stdin programs, or `Solution().<func_name>` calls); the hidden private cases
  (compressed, pickled) are never read.
"""

from __future__ import annotations

import json
from typing import Any

from fugu_pipeline.tasks.references import LETTERS, choice_grader, choices_block

MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
)
MCQ_INSTRUCTION = "\n\nAnswer with the letter of the correct choice."
CODE_STDIN = ("\n\nWrite a complete Python 3 program that reads the input from standard input and writes the answer to "
              "standard output. Reply with the program in one fenced Python code block.")
CODE_FUNCTIONAL = ("\n\nComplete the following Python code (keep the class and method names). Reply with the complete "
                   "code in one fenced Python code block.\n\n```python\n{starter}\n```")

Row = dict[str, Any]


def _text(row: Row, key: str) -> str:
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"field {key!r} is missing or empty")
    return v


def mcq(row: Row) -> tuple[str, str]:
    """(prompt, answer letter) of a multiple-choice row with `question`, `choices` and `answer` (an
    index, or a letter)."""
    choices, answer = row.get("choices"), row.get("answer")
    if not isinstance(choices, list):
        raise ValueError(f"'choices' is not a list: {type(choices).__name__}")
    if isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip() in LETTERS:
        answer = LETTERS.index(answer.strip())
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ValueError(f"'answer' {answer!r} is not an index into {len(choices)} choices")
    return f"{_text(row, 'question').strip()}\n\n{choices_block(choices)}{MCQ_INSTRUCTION}", LETTERS[answer]


def subject_of(row: Row, known: bool = True) -> str:
    """The row's MMLU subject (`subject`, or `type` in the Qwen2.5-Math copy); refuses a missing one
    and, with `known`, one that is not among MMLU's 57."""
    raw = row.get("subject") if row.get("subject") not in (None, "") else row.get("type")
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("no 'subject' (or 'type') field: the subject is the task's domain; export the rows with "
                         "their subject column (cais/mmlu 'all' has it)")
    subject = raw.strip().lower().replace(" ", "_")
    if known and subject not in MMLU_SUBJECTS:
        raise ValueError(f"subject {raw[:60]!r} is not one of MMLU's 57 subjects")
    return subject


def mmlu(row: Row) -> dict[str, Any]:
    prompt, letter = mcq(row)
    subject = subject_of(row)
    return {"prompt": prompt, "domain": subject, "reference_answer": letter, "grader": choice_grader(letter),
            "tags": [f"subject:{subject}"]}


def _json_field(row: Row, key: str, default: Any) -> Any:
    v = row.get(key, default)
    if isinstance(v, str):
        try:
            return json.loads(v) if v.strip() else default
        except ValueError as exc:
            raise ValueError(f"field {key!r} is not valid JSON: {exc}") from None
    return v


def livecodebench(row: Row) -> dict[str, Any]:
    cases = _json_field(row, "public_test_cases", [])
    if not isinstance(cases, list) or not cases:
        raise ValueError("no public test cases ('public_test_cases' is empty): nothing could grade an answer")
    kinds = {c.get("testtype") for c in cases if isinstance(c, dict)}
    if len(kinds) != 1 or kinds - {"stdin", "functional"}:
        raise ValueError(f"test cases of type(s) {sorted(map(str, kinds))}; expected all 'stdin' or all 'functional'")
    mode = kinds.pop()
    tests = []
    for i, c in enumerate(cases):
        if not isinstance(c.get("input"), str) or not isinstance(c.get("output"), str):
            raise ValueError(f"public test case {i + 1} has no text 'input' and 'output'")
        tests.append({"input": c["input"], "output": c["output"]})
    grader: dict[str, Any] = {"type": "io_tests", "mode": mode, "tests": tests}
    content = _text(row, "question_content").strip()
    title = row.get("question_title")
    prompt = (f"{title.strip()}\n\n" if isinstance(title, str) and title.strip() else "") + content
    if mode == "functional":
        meta = _json_field(row, "metadata", {})
        func = meta.get("func_name") if isinstance(meta, dict) else None
        if not func:
            raise ValueError("a functional (LeetCode-style) problem needs metadata.func_name, the method to call")
        grader["func_name"] = func
        prompt += CODE_FUNCTIONAL.format(starter=_text(row, "starter_code").rstrip())
    else:
        prompt += CODE_STDIN
    tags = [f"platform:{row.get('platform')}", f"difficulty:{row.get('difficulty')}",
            f"source_id:{row.get('question_id')}", f"contest_date:{row.get('contest_date')}"]
    return {"prompt": prompt, "domain": "code", "reference_answer": None, "grader": grader,
            "tags": [t for t in tags if not t.endswith(":None")]}
