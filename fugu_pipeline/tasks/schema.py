"""The BenchGen task record and its graders. Plain pydantic, no dagster, no torch."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fugu_pipeline.hashing import sha256_text
from fugu_pipeline.tasks.answers import parse_number

Split = Literal["train", "val", "test"]
SPLITS = ("train", "val", "test")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- graders


MATH_FLAG = ("true: a math answer; when the plain comparison fails, the answer is compared with the reference by "
             "mathematical equivalence (math-verify: LaTeX, fractions, roots, intervals, units, symbolic equality)")


class ExactGrader(Strict):
    type: Literal["exact"]
    case_sensitive: bool = False
    strip: bool = True
    math: bool = Field(False, description=MATH_FLAG)


class ContainsGrader(Strict):
    type: Literal["contains"]
    case_sensitive: bool = False


class NumericGrader(Strict):
    type: Literal["numeric"]
    tolerance: float = Field(0.0, ge=0.0)
    relative: bool = False
    math: bool = Field(False, description=MATH_FLAG)


class RegexGrader(Strict):
    type: Literal["regex"]
    pattern: str | None = None  # default: the reference answer is the pattern
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = []
    full_match: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regex {v!r}: {exc}") from None
        return v


class LLMJudgeGrader(Strict):
    type: Literal["llm_judge"]
    rubric: str = Field(min_length=1)
    scale: int = Field(10, ge=1, description="the judge scores 0..scale; quality = score/scale")


class PythonTestsGrader(Strict):
    """Run the answer's code against a HumanEval-style test program (`def check(candidate)`) in
    the sandbox (`collect/sandbox.py`): quality 1.0 when `check(entry_point)` returns."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["python_tests"]
    test: str = Field(min_length=1, description="test program that defines check(candidate)")
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the function passed to check()")
    timeout_s: float = Field(10.0, gt=0, le=300)
    memory_mb: int = Field(512, ge=64, le=16_384)

    @field_validator("test")
    @classmethod
    def _defines_check(cls, v: str) -> str:
        if not re.search(r"^def check\(", v, re.MULTILINE):
            raise ValueError("the test program must define `def check(candidate)` at top level")
        try:
            compile(v, "<grader.test>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:  # a task-file bug: no answer could pass it
            why = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
            raise ValueError(f"the test program does not compile ({why}): fix grader.test") from None
        return v


class IOCase(Strict):
    input: str
    output: str


class IOTestsGrader(Strict):
    """Run the answer's program on input/output test cases in the sandbox (LiveCodeBench's public
    tests): `stdin` runs it as a script per case (stdin in, stdout compared token by token, numbers
    within 1e-6); `functional` calls `Solution().<func_name>(*args)` with each case's JSON lines as
    arguments and compares the JSON result. Quality 1.0 when every case passes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["io_tests"]
    mode: Literal["stdin", "functional"]
    tests: list[IOCase] = Field(min_length=1)
    func_name: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(6.0, gt=0, le=60, description="per test case; the sandbox run gets this times the cases")
    memory_mb: int = Field(1024, ge=64, le=16_384)

    @model_validator(mode="after")
    def _functional_has_name(self) -> "IOTestsGrader":
        if self.mode == "functional" and not self.func_name:
            raise ValueError("an io_tests grader in functional mode needs func_name (the method to call)")
        return self


Grader = Annotated[
    ExactGrader | ContainsGrader | NumericGrader | RegexGrader | LLMJudgeGrader | PythonTestsGrader | IOTestsGrader,
    Field(discriminator="type"),
]

GRADER_TYPES = ("exact", "contains", "numeric", "regex", "llm_judge", "python_tests", "io_tests")


# --------------------------------------------------------------------------- tasks


class Task(Strict):
    """One BenchGen task. Only the grader ever sees `reference_answer`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1, max_length=256)
    prompt: str = Field(min_length=1)
    domain: str = "general"
    reference_answer: str | None = None
    grader: Grader
    split: Split = "train"
    tags: list[str] = []

    @field_validator("reference_answer", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Task":
        g = self.grader
        ref = self.reference_answer
        if g.type in ("exact", "contains", "numeric") and (ref is None or ref.strip() == ""):
            raise ValueError(f"grader '{g.type}' needs a non-empty reference_answer")
        if g.type == "regex":
            if g.pattern is None and not ref:
                raise ValueError("grader 'regex' needs grader.pattern or a reference_answer to use as the pattern")
            if g.pattern is None:
                try:
                    re.compile(ref)  # type: ignore[arg-type]
                except re.error as exc:
                    raise ValueError(f"reference_answer is used as the regex and does not compile: {exc}") from None
        if g.type == "numeric":
            want = parse_number(ref or "")
            if want is None or not math.isfinite(want):
                raise ValueError(f"grader 'numeric' needs a finite numeric reference_answer, got {ref[:80]!r}")
        if ref and g.type not in ("regex", "python_tests", "io_tests") and len(ref.strip()) >= 1 and _leaks(self.prompt, ref):
            raise ValueError(
                "prompt contains its own reference_answer; only the grader may see the answer "
                "(remove it from the prompt)"
            )
        return self

    @property
    def prompt_hash(self) -> str:
        return sha256_text(self.prompt)


def _leaks(prompt: str, ref: str) -> bool:
    """True when the answer is visibly in the prompt. Short answers ("4", "B") appear in prompts
    by chance, so only answers of 6+ characters, or a phrase like 'answer is X', count."""
    r = ref.strip()
    p = prompt.lower()
    rl = r.lower()
    if len(r) >= 6 and rl in p:
        return True
    return bool(re.search(r"answer\s*(is|:|=)\s*" + re.escape(rl) + r"\b", p))
