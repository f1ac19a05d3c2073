"""The skip budget (`--skip-budget FILE`, CI's `.ci/skip-budget.yaml`): which skips a machine may
have, by reason. Each entry is a regular expression searched in a skip's reason and the most tests
that may skip for it; a skip no entry allows, or more skips than an entry's count, is a problem
printed with its test and reason, and fails the run (`conftest.py`).

```yaml
- reason: "needs CUDA"        # searched in the reason
  max: 2                      # at most this many tests
  why: "CI has no GPU"        # for the reader
```
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator


class Allowed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, description="a regular expression searched in the skip's reason")
    max: int = Field(ge=1, description="the most tests that may skip for it")
    why: str = Field(min_length=1, description="why this machine skips them")

    @field_validator("reason")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"{v!r} is not a regular expression: {exc}") from None
        return v


def load_budget(path: Path) -> list[Allowed]:
    try:
        return TypeAdapter(list[Allowed]).validate_python(yaml.safe_load(path.read_text(encoding="utf-8")) or [])
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise SystemExit(f"--skip-budget {path}: {' '.join(str(exc).split())[:400]}") from None


def over_budget(skips: list[tuple[str, str]], budget: list[Allowed]) -> list[str]:
    """One line per skip no entry allows, and per entry whose count is exceeded (naming its tests)."""
    counted: dict[int, list[str]] = {i: [] for i in range(len(budget))}
    problems = []
    for test, reason in skips:
        hit = next((i for i, a in enumerate(budget) if re.search(a.reason, reason)), None)
        if hit is None:
            problems.append(f"{test}: skipped ({reason}): no entry of the budget allows this reason")
        else:
            counted[hit].append(test)
    for i, tests in counted.items():
        if len(tests) > budget[i].max:
            problems.append(f"{len(tests)} skips for {budget[i].reason!r}, at most {budget[i].max} allowed: "
                            + ", ".join(tests[:10]) + (" ..." if len(tests) > 10 else ""))
    return problems
