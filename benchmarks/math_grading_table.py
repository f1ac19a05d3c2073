"""The MATH-500 grading table: how often a right answer written another way, and a wrong answer, are
graded right, with the plain `exact`/`numeric` graders (before) and with mathematical equivalence
(`math: true`, math-verify; after). Not a test.

For every converted task whose reference allows it, the boxed reference is rewritten one way:
`\\dfrac` for `\\frac`, `\\sqrt2` for `\\sqrt{2}`, `(-1, 1)` for `(-1,1)` (and the reverse), `90` for
`90^\\circ`, `\\text{east}` for `east` (and the reverse). A wrong answer per task changes its last
digit (or, without digits, takes another task's different reference). Every answer is graded by
the task's own grader with `math` off and on.

    python benchmarks/math_grading_table.py /path/to/math500/test.jsonl.gz
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter

from fugu_pipeline.collect.grading import grade_local
from fugu_pipeline.tasks.converters import convert
from fugu_pipeline.tasks.schema import Task

VARIANTS = {
    "\\dfrac for \\frac": lambda r: r.replace("\\frac", "\\dfrac") if "\\frac" in r and "\\dfrac" not in r else None,
    "\\sqrt2 for \\sqrt{2}": lambda r: re.sub(r"\\sqrt\{(\w)\}", r"\\sqrt\1", r) if re.search(r"\\sqrt\{\w\}", r) else None,
    "(-1, 1) for (-1,1)": lambda r: re.sub(r",(?=\S)", ", ", r) if re.search(r"[\(\[].*,\S.*[\)\]]", r) else None,
    "(-1,1) for (-1, 1)": lambda r: r.replace(", ", ",") if re.search(r"[\(\[].*, .*[\)\]]", r) else None,
    "90 for 90^\\circ": lambda r: re.sub(r"\^\{?\\circ\}?", "", r) if re.search(r"\^\{?\\circ", r) else None,
    "\\text{east} for east": lambda r: f"\\text{{{r}}}" if re.fullmatch(r"[A-Za-z][A-Za-z ]*", r) else None,
    "east for \\text{east}": lambda r: m.group(1) if (m := re.fullmatch(r"\\text\{([^{}]+)\}", r)) else None,
}


def wrong_of(ref: str, others: list[str]) -> str:
    digits = [m.start() for m in re.finditer(r"\d", ref)]
    if digits:
        i = digits[-1]
        return ref[:i] + str((int(ref[i]) + 1) % 10) + ref[i + 1:]
    return next(o for o in others if o.strip() != ref.strip())


def with_math(task: Task, on: bool) -> Task:
    g = task.grader
    if g.type not in ("exact", "numeric"):
        return task
    return task.model_copy(update={"grader": g.model_copy(update={"math": on})})


def right(task: Task, answer: str) -> bool:
    return grade_local(task, answer).quality >= 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="MATH-500 test.jsonl(.gz)")
    args = ap.parse_args()
    rows, report = convert("math500", args.data)
    tasks = [Task.model_validate(r) for r in rows]
    print(f"{len(tasks)} tasks converted; graders: {dict(Counter(t.grader.type for t in tasks))}")
    refs = [t.reference_answer or "" for t in tasks]
    t0 = time.perf_counter()
    print("| answer written as | tasks | graded right before | graded right after |")
    print("|---|---|---|---|")
    same_b = same_a = 0
    for t in tasks:
        ans = f"So the answer is \\boxed{{{t.reference_answer}}}."
        same_b += right(with_math(t, False), ans)
        same_a += right(with_math(t, True), ans)
    print(f"| the reference itself | {len(tasks)} | {same_b}/{len(tasks)} | {same_a}/{len(tasks)} |")
    for name, rewrite in VARIANTS.items():
        n = before = after = 0
        for t in tasks:
            v = rewrite(t.reference_answer or "")
            if v is None or v == t.reference_answer:
                continue
            ans = f"So the answer is \\boxed{{{v}}}."
            n += 1
            before += right(with_math(t, False), ans)
            after += right(with_math(t, True), ans)
        print(f"| {name} | {n} | {before}/{n} | {after}/{n} |")
    wb = wa = 0
    for i, t in enumerate(tasks):
        ans = f"So the answer is \\boxed{{{wrong_of(t.reference_answer or '', refs[i + 1:] + refs[:i])}}}."
        wb += right(with_math(t, False), ans)
        wa += right(with_math(t, True), ans)
    print(f"| a wrong answer (graded right = false positive) | {len(tasks)} | {wb}/{len(tasks)} | {wa}/{len(tasks)} |")
    print(f"({time.perf_counter() - t0:.1f}s for every grade, the equivalence checks included)")


if __name__ == "__main__":
    sys.exit(main())
