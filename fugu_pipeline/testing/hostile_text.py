"""Every reader of untrusted text (a worker's reply, a prompt, an imported file's answer) and the
hostile texts that once made one of them take exponential or quadratic time: long digit runs,
thousands of `=`, deep brackets, a megabyte of one character, each mixed with the readers' own
trigger tokens (`A:`, `####`, `\\boxed{`, `VERDICT`, option letters), and lone surrogates.

`test_untrusted_text.py` draws from `PIECES` with hypothesis; `benchmarks/bench_untrusted_text.py`
times every reader on `hostile_texts(n)` against a floor measured on the same text. One list, so a
new reader is tested and timed once it is added here.
"""

from __future__ import annotations

from typing import Callable

# the readers' own trigger tokens and the characters their patterns repeat
TRIGGERS = ("A:", "A: ", "####", "#### ", "\\boxed{", "\\fbox{", "}", "VERDICT", "VERDICT: ", "ACCEPT", "REVISE",
            "(A)", "(B) ", "A.", "B)", "[C]", "D:", "answer is ", "Answer: ", "The answer is (", "result = ", "SCORE: ",
            "```", "```python\n", "<think>", "</think>", "<<", ">>", "Latest verdict (turn 1", "Role: Worker\n",
            "# Output (a):\n", "Response B\n", "**Option C:**", "wait", "actually", "=", "==", "$", "\\$", "%", "x", "×", "÷", "^", "**", "\\frac{", "def f(", "\ud800", "\udfff")
FILLERS = ("1", "10", "0.5", "1,", ".", ",", " ", "\t", "\n", "\r\n", "(", ")", "[", "{", "+", "-", "*", "/", "=", "a", "é",
           "\u00a0", "\u2003", "\ud83d")
PIECES = TRIGGERS + FILLERS


def _counting_encoder(texts: list[str]):
    """A stand-in for the encoder (its own work is bounded by its truncation): two counts per text."""
    import numpy as np

    return np.array([[len(t) % 7 + 1.0, t.count("a") + 1.0] for t in texts])


def _readers() -> dict[str, Callable[[str], object]]:
    from fugu_pipeline.api_keys import scrub_secrets
    from fugu_pipeline.collect.code_grader import extract_code
    from fugu_pipeline.collect.grading import grade_local
    from fugu_pipeline.collect.math_equivalence import compared_answer
    from fugu_pipeline.policies.cascade.answer_checks import arithmetic_steps, check_stats, option_stats, prompt_options
    from fugu_pipeline.policies.cascade.answer_features import answer_stats, answer_text
    from fugu_pipeline.policies.cascade.code_examples import PROMPT_CHARS, _examples_in
    from fugu_pipeline.policies.cascade.option_fit import option_fit
    from fugu_pipeline.features.lexical import lexical_features
    from fugu_pipeline.session.roles import extractable_answer, objection, parse_verdict
    from fugu_pipeline.tasks.answers import boxed_contents, extract_final_number, final_line, parse_number
    from fugu_pipeline.tasks.final_answer import detect_kind, extract
    from fugu_pipeline.tasks.references import choice_pattern
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.mock_roles import parse_role_request

    tasks = {g: Task(task_id="t", prompt="Which?\nA. x\nB. y", reference_answer=ref, grader=grader) for g, ref, grader in (
        ("numeric", "12", {"type": "numeric"}), ("exact", "twelve", {"type": "exact"}),
        ("contains", "twelve", {"type": "contains"}), ("regex", "B", {"type": "regex", "pattern": choice_pattern("B")}))}
    out: dict[str, Callable[[str], object]] = {
        "answer_checks.arithmetic_steps": arithmetic_steps,
        "answer_checks.check_stats": lambda t: check_stats(t, t[-30:], t),
        "answer_checks.prompt_options": prompt_options,
        "answer_checks.option_stats": lambda t: option_stats(t, "A", t),
        "answer_features.answer_stats": lambda t: answer_stats(t, t[-30:], t),
        "answer_features.answer_text": lambda t: answer_text(t, t[:30]),
        "option_fit.option_fit": lambda t: option_fit([(t, "A", t), (t, t[-30:], t)], _counting_encoder),
        "code_examples.prompt_examples": lambda t: _examples_in.__wrapped__(t[-PROMPT_CHARS:]),  # not the memo
        "lexical.lexical_features": lambda t: lexical_features([t]),
        "final_answer.detect_kind": lambda t: detect_kind(t, [t, t]),
        "answers.extract_final_number": extract_final_number,
        "answers.final_line": final_line,
        "answers.boxed_contents": boxed_contents,
        "answers.parse_number": parse_number,
        "math_equivalence.compared_answer": compared_answer,
        "roles.parse_verdict": parse_verdict,
        "roles.objection": objection,
        "roles.extractable_answer": lambda t: [extractable_answer(t, r, g) for r, g in
                                               (("thinker", None), ("worker", "numeric"), ("worker", "exact"))],
        "code_grader.extract_code": lambda t: extract_code(t, "f"),
        "mock_roles.parse_role_request": lambda t: parse_role_request([{"role": "system", "content": "Role: Worker"},
                                                                       {"role": "user", "content": t}]),
        "api_keys.scrub_secrets": lambda t: scrub_secrets(t, "sk-0123456789abcdefghij"),
    }
    for kind in ("choice", "number", "code", "text"):
        out[f"final_answer.extract[{kind}]"] = lambda t, k=kind: extract(t, k)
    for g, task in tasks.items():
        out[f"grading.grade_local[{g}]"] = lambda t, task=task: grade_local(task, t)
    return out


READERS: dict[str, Callable[[str], object]] = _readers()


def hostile_texts(n: int) -> dict[str, str]:
    """Named hostile texts of about `n` characters each."""
    k = max(1, n // 12)
    mixed = "".join(t + "1" * 40 + " " * 40 + "=" for t in TRIGGERS)
    return {
        "digits": "1" * n,
        "digits before =": "Compute x = " + "10" * (n // 2) + " y = 1",
        "= run": "=" * n,
        "1= run": "1=" * (n // 2),
        "operators": "+ " * (n // 2) + "= 1",
        "comma digits": "1," * (n // 2) + "=",
        "decimals": "1.5." * (n // 4) + "=",
        "parentheses": "(" * (n // 2) + ")" * (n // 2),
        "boxed": "\\boxed{" * (n // 7),
        "brackets": "[" * n,
        "spaces": " " * n,
        "newlines": "\n" * n,
        "one character (a)": "a" * n,
        "surrogates": "\ud800" * n,
        "options": "(A) " * (n // 4),
        "option lines": "A." + " " * n + "\n",
        "option, spaces, (": "(A)" + " " * n + "x(",  # the old option reader: 1,000 spaces 8.6 s, 2,000 71 s
        "verdict, spaces": "VERDICT" + " " * n + "x",
        "answer is, spaces": "answer is" + " " * n + "x",
        "#### runs": "#### " * (n // 5),
        "A: lines": "A: 1\n" * (n // 5),
        "fences": "```\n" * (n // 4),
        "triggers, runs": (mixed * (n // len(mixed) + 1))[:n],
        "tokens, digits": ("#### 1" + "1" * k + " answer is " + "2" * k + " \\boxed{" + "3" * k) * 3,
    }
