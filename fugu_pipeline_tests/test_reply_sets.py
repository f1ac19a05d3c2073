"""The converters of public releases with several models' recorded replies (benchmarks/choice_sets.py,
code_sets.py, reply_sets.py), on hand-made tiny folders in each release's layout and format: every
model's reply, its grade and cost per row, the options in a multiple-choice prompt, questions every
model answered only; a checkout and a bare git directory read alike; a malformed file or row is one
line naming the file, the row's line and the field; the mixed import shares its workers."""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.choice_sets import CSQA_FILES, LLMBAR_EVALUATORS, LLMBAR_PROMPT, LLMBAR_SUBSETS, PRICES, csqa_rows, llmbar_rows
from benchmarks.code_sets import PRICES as CODE_PRICES
from benchmarks.code_sets import LDB_MODELS, humaneval_rows, humaneval_tasks, ldb_rows, mbpp_rows, regrade
from benchmarks.zeroeval_sets import MODELS as CRUX_MODELS
from benchmarks.zeroeval_sets import PRICES as ZEROEVAL_PRICES
from benchmarks.zeroeval_sets import crux_right, number_right, task_rows
from benchmarks.zeroeval_sets import reply_answer as crux_answer
from benchmarks.release_files import ReleaseFormatError, call_cost
from benchmarks.reply_sets import set_rows
from fugu_pipeline.policies.cascade.answer_checks import prompt_options

PROMPTER = 'TEXT_PROMPT_CHOIECES = """\nQ: {question}\n\nPick one.\n"""\nact2methodology = {"vanilla": "", "cot": "Think."}\n'


def csqa_row(qid, key="B", cot=("Mexico it is: \\boxed{B}", 1), vanilla=("\\boxed{B}", 1)):
    return {"answerKey": key, "id": qid, "question": {"stem": f"Question {qid}?", "choices": [
        {"label": "A", "text": "diner"}, {"label": "B", "text": "mexico"}, {"label": "C", "text": "kitchen"}]},
        "vanilla": {"generation": [vanilla[0]], "answer": "B", "score": vanilla[1]},
        "cot": {"generation": [cot[0]], "answer": "B", "score": cot[1]}}


def csqa_release(root, last=None):
    (root / "results").mkdir(parents=True)
    (root / "prompter.py").write_text(PROMPTER)
    logs = {m: [csqa_row(1), csqa_row(2, cot=("No idea: \\boxed{A}", 0))] for m in CSQA_FILES}
    logs["gpt-4o-mini"] = last if last is not None else [csqa_row(2), csqa_row(1), csqa_row(3)]
    for m, rel in CSQA_FILES.items():
        (root / rel).write_text("\n".join(json.dumps(r) for r in logs[m]) + "\n")
    return root


def test_csqa_rows_hold_every_models_reply_verdict_cost_and_the_options(tmp_path):
    rows, notes = csqa_rows(csqa_release(tmp_path / "re2"), acts=("vanilla", "cot"))
    assert [r.task_id for r in rows] == ["csqa-0001", "csqa-0002"]  # question 3 lacks two models' replies
    one, two = rows
    assert one.worker_ids == [*(f"{m}:direct" for m in CSQA_FILES), *CSQA_FILES]
    assert two.quality == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0] and two.answers[3] == "No idea: \\boxed{A}"
    assert one.prompt == "\nQ: Question 1? Answer Choices: (A) diner (B) mexico (C) kitchen\n\nPick one.\n\nA: "
    assert prompt_options(one.prompt) == {"A": "diner", "B": "mexico", "C": "kitchen"}  # the options a verifier reads
    cot_prompt = one.prompt + "Think."
    want = call_cost(len("You are a helpful assistant.") + len(cot_prompt), len(one.answers[5]), PRICES["gpt-4o-mini"])
    assert one.cost_usd[5] == pytest.approx(want, rel=1e-12) and one.answer_kind == "choice" and one.domain == "commonsenseqa"
    assert notes["questions"] == 2 and notes["commit"] is None
    cot_only, _ = csqa_rows(tmp_path / "re2")
    assert cot_only[0].worker_ids == list(CSQA_FILES) and cot_only[0].prompt.endswith("A: Think.")


@pytest.mark.parametrize("row, field, why", [
    ({**csqa_row(2), "cot": {"generation": ["x"], "score": 2}}, "'cot.score'", "is 2, not 0 or 1"),
    ({**csqa_row(2), "question": {"choices": []}}, "'question.stem'", "is missing"),
    ({**csqa_row(2), "id": "2"}, "'id'", "is a str, not int"),
    ({**csqa_row(2), "cot": {"generation": [], "score": 1}}, "'cot.generation'", "is not a list of one reply"),
])
def test_a_malformed_csqa_row_names_the_file_its_line_and_the_field(tmp_path, row, field, why):
    root = csqa_release(tmp_path / "re2", last=[csqa_row(1), row])
    with pytest.raises(ReleaseFormatError) as got:
        csqa_rows(root)
    msg = str(got.value)
    assert msg.startswith(f"{CSQA_FILES['gpt-4o-mini']} line 2: {field} {why}") and "\n" not in msg
    assert "Rereading-LLM-Reasoning" in msg  # what to do: an untouched copy of the study's file


PAIRS = [{"input": "Say hi.", "output_1": "hi", "output_2": "Hello there, friend!", "label": 1},
         {"input": "Name a color.", "output_1": "7", "output_2": "blue", "label": 2}]


def judged(winners, pairs=PAIRS):
    return [{**p, "results": [{"swap = False": {"completion": [f"Reasoning {k}. Therefore, Output (a) is better.", "stop"],
                                                "winner": w}, "swap = True": {}}]} for k, (p, w) in enumerate(zip(pairs, winners))]


def llmbar_release(root, gpt4=None):
    prompt = root / LLMBAR_PROMPT
    prompt.parent.mkdir(parents=True)
    prompt.write_text("<|im_start|>system\nJudge.\n<|im_end|>\n<|im_start|>user\n# Instruction:\n{input}\n\n"
                      "# Output (a):\n{output_1}\n\n# Output (b):\n{output_2}\n<|im_end|>")
    for subset in LLMBAR_SUBSETS:
        base = root / "Dataset" / "LLMBar" / subset
        base.mkdir(parents=True)
        (base / "dataset.json").write_text(json.dumps(PAIRS, indent=4))
        for name in LLMBAR_EVALUATORS:
            (base / "evaluators" / name / "CoT").mkdir(parents=True)
            rows = gpt4 if name == "GPT-4" and gpt4 is not None else judged(["1", None] if name == "GPT-4" else ["2", "2"])
            (base / "evaluators" / name / "CoT" / "result.json").write_text(json.dumps(rows, indent=4))
    return root


def test_llmbar_rows_grade_each_evaluators_decision_against_the_label(tmp_path):
    rows, notes = llmbar_rows(llmbar_release(tmp_path / "llmbar"))
    assert len(rows) == 2 * len(LLMBAR_SUBSETS) and rows[0].task_id == "llmbar-natural-000"
    first, second = rows[:2]
    assert first.worker_ids == list(LLMBAR_EVALUATORS.values())
    assert first.quality == [0.0] * 5 + [1.0] and second.quality == [1.0] * 5 + [0.0]  # no decision (null) is wrong
    assert first.prompt == "Judge.\n\n# Instruction:\nSay hi.\n\n# Output (a):\nhi\n\n# Output (b):\nHello there, friend!"
    assert first.tags == ["subset:Natural", "answer:A"] and second.tags[1] == "answer:B"
    assert first.cost_usd[5] == pytest.approx(call_cost(len(first.prompt), len(first.answers[5]), PRICES["gpt-4"]))
    assert notes["pairs"] == 10


def test_an_llmbar_result_out_of_step_with_its_dataset_is_refused(tmp_path):
    root = llmbar_release(tmp_path / "llmbar", gpt4=judged(["1", "2"], pairs=[PAIRS[0], {**PAIRS[1], "input": "Other."}]))
    rel = "Dataset/LLMBar/Natural/evaluators/GPT-4/CoT/result.json"
    line = [n for n, text in enumerate((root / rel).read_text().splitlines(), 1) if text == "    {"][1]  # the second row
    with pytest.raises(ReleaseFormatError, match=rf"^{rel} line {line}: 'input' differs from the same row of"):
        llmbar_rows(root)
    root = llmbar_release(tmp_path / "other", gpt4=judged(["1", "3"]))
    with pytest.raises(ReleaseFormatError, match=rf"^{rel} line {line}: 'winner' is '3', not"):
        llmbar_rows(root)


def trace(model, n, result="Pass", code="def f():\n    return 1\n", tokens=True):
    meta = "Completion tokens: 40<br />\n" if tokens else ""
    return (f"# Results of {model} on HumanEval/{n}\nModel: {model}<br />\n## Prompt\n" + ("Tokens: 100\n" if tokens else "")
            + f"```python\ndef f():\n    \"\"\"problem {n}\"\"\"\n```\nThe above is an incomplete Python code fragment.\n"
            "## Correct solution\n```python\npass\n```\n## Unit tests\n```python\ndef check(c): pass\n```\n## Runs\n"
            f"### ✅ Run 1\nStart time: 2023-09-01 02:48:39<br />\nDuration: 4.5s<br />\n{meta}Result: {result}\n"
            f"```python\n{code}```\n### ❌ Run 2\nStart time: x<br />\nDuration: 1s<br />\nResult: Fail\n```python\nno\n```\n")


def humaneval_release(root, broken=None):
    for m in ("codellama-34b-instruct", "gpt-3.5-turbo", "gpt-4"):
        (root / m).mkdir(parents=True)
        for n in range(164):
            text = trace(m, n, "Fail" if m == "gpt-3.5-turbo" and n == 1 else "Pass", tokens=m != "codellama-34b-instruct")
            (root / m / f"{n}.md").write_text(broken if (broken and m == "gpt-4" and n == 7) else text)
    return root


def test_humaneval_rows_hold_the_first_runs_code_result_latency_and_cost(tmp_path):
    rows, notes = humaneval_rows(humaneval_release(tmp_path / "he"))
    assert len(rows) == 164 and rows[1].task_id == "HumanEval/1" and rows[1].quality == [1.0, 0.0, 1.0]
    r = rows[0]
    assert r.answers == ["def f():\n    return 1\n"] * 3 and r.latency_s == [4.5] * 3 and r.answer_kind == "code"
    assert r.prompt == '```python\ndef f():\n    """problem 0"""\n```\nThe above is an incomplete Python code fragment.'
    assert r.cost_usd[2] == pytest.approx((100 * 30.0 + 40 * 60.0) / 1e6)  # the recorded token counts
    assert r.cost_usd[0] == pytest.approx(call_cost(len(r.prompt), len(r.answers[0]), CODE_PRICES["codellama-34b-instruct"]))
    assert notes["run"] == 1 and notes["problems"] == 164


def test_a_malformed_trace_names_the_file_and_the_field(tmp_path):
    root = humaneval_release(tmp_path / "he", broken=trace("gpt-4", 7, result="Maybe"))
    with pytest.raises(ReleaseFormatError, match=r"^gpt-4/7.md line 19: run 1's 'Result' is 'Maybe', not Pass or Fail"):
        humaneval_rows(root)
    root = humaneval_release(tmp_path / "he1", broken=trace("gpt-4", 7).replace("### ✅ Run 1", "### Run one"))
    with pytest.raises(ReleaseFormatError, match=r"^gpt-4/7.md line 18: '## Runs' has no 'Run 1'"):
        humaneval_rows(root)
    root = humaneval_release(tmp_path / "he2", broken="# no sections\n")
    with pytest.raises(ReleaseFormatError, match=r"^gpt-4/7.md: no '## Prompt' section"):
        humaneval_rows(root)


def test_regrading_runs_the_replies_against_humaneval_tests_in_the_sandbox(tmp_path):
    rows, _ = humaneval_rows(humaneval_release(tmp_path / "he"))
    rows = rows[:2]
    rows[0].answers = ["def f():\n    return 1\n", "def f():\n    return 2\n", "x = ("]
    tasks = tmp_path / "HumanEval.jsonl"
    tasks.write_text("\n".join(json.dumps({"task_id": f"HumanEval/{n}", "prompt": "def f():\n", "entry_point": "f",
                                           "test": "def check(candidate):\n    assert candidate() == 1\n"}) for n in range(2)))
    got = regrade(rows, humaneval_tasks(tasks))
    assert rows[0].quality == [1.0, 0.0, 0.0] and rows[1].quality == [1.0, 1.0, 1.0]
    assert got["cells"] == 6 and got["differ_from_recorded"] == 3  # two wrong replies recorded as passing, one failing run right


def mbpp_row(name, solved=True, reply="```python\ndef f(x):\n    return x\n```"):
    return {"name": name, "prompt": f'def f(x: int) -> int:\n    """\n\t{name}: give x back.\n\t"""\n', "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(4) == 4\n\ndef test_check():\n    check(f)\n\ntest_check()\n",
            "sample_io": ["assert f(3) == 3"], "responses": [reply], "prompt_tokens": [80, 20], "completion_tokens": [40],
            "no_of_try": 1, "is_solved": solved}


def mbpp_release(root, turbo=None, big=None, strategy="CoT"):
    (root / "results" / "MBPP").mkdir(parents=True)
    files = {"QwenCoderTurbo": turbo or [mbpp_row("mbpp_1_f", solved=False), mbpp_row("mbpp_2_f"), mbpp_row("mbpp_3_f")],
             "QwenCoder480b": big or [mbpp_row("mbpp_2_f"), mbpp_row("mbpp_1_f"), mbpp_row("mbpp_1_f", solved=False)]}
    for m, rows in files.items():
        text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
        (root / "results" / "MBPP" / f"{m}-{strategy}-MBPP-Python3-0.0-1-merged.jsonl").write_text(text)
    return root


def test_mbpp_rows_pair_each_problem_across_models_and_show_its_example(tmp_path):
    rows, notes = mbpp_rows(mbpp_release(tmp_path / "m"))
    # mbpp_3_f: the big model's file lacks it; mbpp_1_f written twice: its first row counts
    assert [r.task_id for r in rows] == ["mbpp_1_f", "mbpp_2_f"] and notes["left_out"] == 1
    assert rows[0].quality == [0.0, 1.0] and rows[1].quality == [1.0, 1.0] and rows[0].answer_kind == "code"
    assert rows[0].prompt.endswith('"""\n\nYour code should pass this test:\nassert f(3) == 3')
    assert rows[0].cost_usd[1] == pytest.approx((100 * CODE_PRICES["QwenCoder480b"][0] + 40 * CODE_PRICES["QwenCoder480b"][1]) / 1e6)
    from fugu_pipeline.policies.cascade.code_examples import prompt_examples

    assert prompt_examples(rows[0].prompt) == ("f", (("assert", "assert f(3) == 3"),))  # what the example runs read
    rows, notes = mbpp_rows(mbpp_release(tmp_path / "sp", strategy="SelfPlanning"), "SelfPlanning")
    assert notes["strategy"] == "SelfPlanning" and len(rows) == 2
    with pytest.raises(SystemExit, match="unknown MBPP strategy 'Plan'; one of Direct, CoT"):
        mbpp_rows(tmp_path / "sp", "Plan")
    rows, _ = set_rows("mbpp", [mbpp_release(tmp_path / "cot")])
    assert [r.task_id for r in rows] == ["mbpp_1_f", "mbpp_2_f"]


def test_mbpp_regrading_runs_each_reply_against_the_asserts_its_release_holds(tmp_path):
    wrong = "```python\ndef f(x):\n    return x + 1\n```"
    root = mbpp_release(tmp_path / "m", turbo=[mbpp_row("mbpp_1_f", solved=True, reply=wrong), mbpp_row("mbpp_2_f", solved=False)])
    rows, notes = set_rows("mbpp", [root], regrade=True)
    assert [r.quality for r in rows] == [[0.0, 1.0], [1.0, 1.0]]  # a wrong reply recorded solved, a right one recorded failed
    assert notes["regraded"] == {"cells": 4, "differ_from_recorded": 2, "not_regraded": [],
                                 "differing": [("mbpp_1_f", "QwenCoderTurbo"), ("mbpp_2_f", "QwenCoderTurbo")]}
    with pytest.raises(SystemExit, match="MBPP's tests are in its release; give --regrade without a file"):
        set_rows("mbpp", [root], regrade=tmp_path / "HumanEval.jsonl")
    with pytest.raises(SystemExit, match="pass HumanEval's task file"):
        set_rows("humaneval", [tmp_path / "he"], regrade=True)
    with pytest.raises(SystemExit, match="--regrade grades HumanEval, MBPP or LDB replies; llmbar has none"):
        set_rows("llmbar", [tmp_path / "llmbar"], regrade=True)
    broken = mbpp_release(tmp_path / "b", turbo=[{**mbpp_row("mbpp_1_f"), "entry_point": 3}, mbpp_row("mbpp_2_f")])
    with pytest.raises(ReleaseFormatError, match="QwenCoderTurbo-CoT-MBPP-Python3-0.0-1-merged.jsonl line 1: the field 'entry_point' "
                                                 "is missing or not a str"):
        set_rows("mbpp", [broken], regrade=True)


@pytest.mark.parametrize("line, field", [("{not json", "not a JSON object"), ('{"name": "x"}', "the field 'prompt' is missing"),
                                         (json.dumps({**mbpp_row("x"), "responses": []}), "'responses' is empty"),
                                         (json.dumps({**mbpp_row("x"), "completion_tokens": ["40"]}), "other than token counts")])
def test_a_malformed_mbpp_row_names_the_file_its_line_and_the_field(tmp_path, line, field):
    root = mbpp_release(tmp_path / "m", turbo=[mbpp_row("mbpp_1_f"), line])
    with pytest.raises(ReleaseFormatError, match=rf"^results/MBPP/QwenCoderTurbo-CoT-MBPP-Python3-0.0-1-merged.jsonl line 2: .*{field}"):
        mbpp_rows(root)


def ldb_row(task_id, solved=True, solution="def f(x):\n    return x\n", given=("assert f(3) == 3", "assert f(5) == 5")):
    return {"task_id": task_id, "prompt": 'def f(x):\n    """Give x back."""\n', "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(4) == 4\n", "given_tests": list(given),
            "canonical_solution": "", "seed": "", "solution": solution, "is_solved": solved}


def ldb_release(root, files=None):
    """Three sets x three models; each model's file in an order of its own; MBPP/3 missing from starcoder's."""
    default = {ts: [ldb_row(f"{ts}/1"), ldb_row(f"{ts}/2", solved=False)] for ts in ("humaneval", "mbpp", "transcoder")}
    default["mbpp"].append(ldb_row("mbpp/3"))
    for ts, rows in default.items():
        for m in LDB_MODELS:
            mine = (files or {}).get((ts, m), rows[::-1] if m == "codellama" else rows)
            if ts == "mbpp" and m == "starcoder" and (ts, m) not in (files or {}):
                mine = rows[:2]
            (root / "input_data" / ts / "seed" / m).mkdir(parents=True, exist_ok=True)
            text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in mine) + "\n"
            (root / "input_data" / ts / "seed" / m / "seed.jsonl").write_text(text)
    return root


def test_ldb_rows_pair_each_problem_across_models_and_sets_and_show_one_test(tmp_path):
    rows, notes = ldb_rows(ldb_release(tmp_path / "ldb"))
    assert [(r.domain, r.task_id) for r in rows] == [("humaneval", "humaneval/1"), ("humaneval", "humaneval/2"),
                                                   ("mbpp", "mbpp/1"), ("mbpp", "mbpp/2"),
                                                   ("transcoder", "transcoder/1"), ("transcoder", "transcoder/2")]
    assert notes["left_out"] == 2 and notes["problems"] == 6  # mbpp/3: in two of the three files
    assert rows[0].worker_ids == ["gpt-3.5-turbo-0613", "codellama-34b-instruct", "starcoder"]
    assert rows[1].quality == [0.0, 0.0, 0.0] and rows[0].quality == [1.0, 1.0, 1.0] and rows[0].answer_kind == "code"
    assert rows[0].prompt == 'def f(x):\n    """Give x back."""\n'  # HumanEval's docstring shows its examples
    assert rows[2].prompt.endswith('"""\n\nYour code should pass this test:\nassert f(3) == 3')  # the first test only
    assert rows[4].prompt == rows[2].prompt
    chars = len(rows[2].prompt) / 4, len("def f(x):\n    return x\n") / 4
    assert rows[2].cost_usd[2] == pytest.approx((chars[0] * CODE_PRICES["starcoder"][0] + chars[1] * CODE_PRICES["starcoder"][1]) / 1e6)
    from fugu_pipeline.policies.cascade.code_examples import prompt_examples

    assert prompt_examples(rows[2].prompt) == ("f", (("assert", "assert f(3) == 3"),))  # what the example runs read
    assert [r.task_id for r in set_rows("ldb", [tmp_path / "ldb"])[0]] == [r.task_id for r in rows]


def test_ldb_regrading_runs_each_program_against_the_asserts_its_release_holds(tmp_path):
    wrong = "def f(x):\n    return x + 1\n"
    nul = {**ldb_row("transcoder/2", solved=False), "test": "def check(candidate):\n    assert candidate('a') == \x00\n"}
    files = {("mbpp", "starcoder"): [ldb_row("mbpp/1", solved=True, solution=wrong), ldb_row("mbpp/2", solved=False)],
             **{("transcoder", m): [ldb_row("transcoder/1"), nul] for m in LDB_MODELS}}
    rows, notes = set_rows("ldb", [ldb_release(tmp_path / "ldb", files)], regrade=True)
    # every "/2" program is right but recorded failing (6 cells graded), and one wrong program recorded solved;
    # TransCoder's test that no Python program may hold keeps its recorded verdicts, named
    assert notes["regraded"]["cells"] == 15 and notes["regraded"]["differ_from_recorded"] == 7
    assert [t for t, _ in notes["regraded"]["not_regraded"]] == ["transcoder/2"]
    assert "null" in notes["regraded"]["not_regraded"][0][1]
    assert {r.task_id: r.quality for r in rows}["transcoder/2"] == [0.0, 0.0, 0.0]
    assert ("mbpp/1", "starcoder") in notes["regraded"]["differing"]  # a wrong program recorded as solved
    assert ("humaneval/2", "codellama-34b-instruct") in notes["regraded"]["differing"]  # a right one recorded failing
    by = {r.task_id: r.quality for r in rows}
    assert by["mbpp/1"] == [1.0, 1.0, 0.0] and by["mbpp/2"] == [1.0, 1.0, 1.0]
    with pytest.raises(SystemExit, match="LDB's tests are in its release; give --regrade without a file"):
        set_rows("ldb", [tmp_path / "ldb"], regrade=tmp_path / "HumanEval.jsonl")


@pytest.mark.parametrize("line, field", [
    ("[1, 2]", "the field 'task_id' is missing or not a str"),
    (json.dumps({**ldb_row("mbpp/9"), "is_solved": "yes"}), "the field 'is_solved' is missing or not a bool"),
    (json.dumps({**ldb_row("mbpp/9"), "given_tests": [3]}), "'given_tests' holds something other than asserts"),
    (json.dumps(ldb_row("mbpp/1")), "the field 'task_id' \\('mbpp/1'\\) is written twice")])
def test_a_malformed_ldb_row_names_the_file_its_line_and_the_field(tmp_path, line, field):
    root = ldb_release(tmp_path / "ldb", {("mbpp", "codellama"): [ldb_row("mbpp/1"), line]})
    with pytest.raises(ReleaseFormatError, match=rf"^input_data/mbpp/seed/codellama/seed.jsonl line 2: {field}"):
        ldb_rows(root)


def crux_release(root, rows_by_model, task="crux"):
    (root / "result_dirs" / task).mkdir(parents=True, exist_ok=True)
    for m in CRUX_MODELS:
        (root / "result_dirs" / task / f"{m}.json").write_text(json.dumps(rows_by_model.get(m, rows_by_model["*"]), indent=2))
    return root


def crux_item(k, reply, answer="[1, 2]"):
    return {"id": f"crux-test-#{k}", "chat_history": [f"Predict f({k})."], "output": [reply], "answer": answer}


def test_crux_replies_are_read_from_their_json_and_graded_as_strings_or_literals(tmp_path):
    raw_newline = '```json\n{\n "reasoning": "line one\nline two",\n "answer": "[1,2]"\n}\n```'
    rows_by_model = {"*": [crux_item(0, raw_newline), crux_item(1, '{"answer": "\\"ab\\""}', "'ab'")],
                     "gpt-4o-2024-08-06": [crux_item(1, "no json at all", "'ab'"), crux_item(0, '"answer": "[1, 3]"')]}
    rows, notes = task_rows(crux_release(tmp_path / "ze", rows_by_model), "crux")
    assert [r.task_id for r in rows] == ["crux-0", "crux-1"] and rows[0].prompt == "Predict f(0)."
    assert rows[0].quality == [1.0] * 4 + [0.0, 1.0] and rows[1].quality == [1.0] * 4 + [0.0, 1.0]
    assert crux_answer(raw_newline) == "[1,2]" and crux_answer('x "answer": "\\"q\\"" y') == '"q"'
    assert crux_right("(1, 'a')", "(1, 'a')") and crux_right("(1,'a')", "(1, 'a')") and not crux_right("1st", "1")
    assert rows[0].cost_usd[0] == pytest.approx(call_cost(len("Predict f(0)."), len(raw_newline), ZEROEVAL_PRICES[CRUX_MODELS[0]]))
    assert notes["problems"] == 2


def math_item(k, reply, answer):
    return {"id": k, "chat_history": [f"What is {k} + {k}?"], "output": [reply], "answer": answer}


def test_math_replies_are_graded_by_their_first_number_as_zeroeval_grades_them(tmp_path):
    gsm = {"*": [math_item("gsm8k-main-test-#0", '{"reasoning": "r", "answer": "$1,450,000 in total"}', "# 1,450,000"),
                 math_item("gsm8k-main-test-#1", 'no json, but "answer": 18 }', "# 18")],
           "claude-3-haiku-20240307": [math_item("gsm8k-main-test-#0", "So \\boxed{1} then \\boxed{1450000}.", "# 1,450,000"),
                                       math_item("gsm8k-main-test-#1", "\\boxed{18}", "# 18")],
           "gpt-4o-2024-08-06": [math_item("gsm8k-main-test-#0", '{"answer": "1,450,001"}', "# 1,450,000"),
                                 math_item("gsm8k-main-test-#1", "I think it is 18.", "# 18")]}
    math = {"*": [math_item(0, '```json\n{"reasoning": "a\nb", "answer": "3/4"}\n```', "0.75"),
                  math_item(1, '{"answer": "-221_3"}', "-221_3")],
            "claude-3-5-sonnet-20241022": [math_item(0, '{"answer": "3/0"}', "0.75"), math_item(1, '{"answer": "221_3"}', "-221_3")]}
    root = crux_release(crux_release(tmp_path / "ze", gsm, "gsm"), math, "math-l5")
    rows, notes = task_rows(root, "gsm")
    assert [r.task_id for r in rows] == ["gsm-0", "gsm-1"] and notes["problems"] == 2
    assert rows[0].quality == [1.0] * 4 + [0.0, 1.0]  # off by one: wrong; units and commas do not matter
    assert rows[1].quality == [1.0] * 4 + [0.0, 1.0]  # an unquoted answer is read; prose with no answer field is not
    rows, _ = task_rows(root, "math-l5")
    assert [r.task_id for r in rows] == ["math-l5-0", "math-l5-1"] and {r.answer_kind for r in rows} == {"number"}
    assert rows[0].quality == [1.0] * 5 + [0.0] and rows[1].quality == [1.0] * 5 + [0.0]  # 3/4 is 0.75; a zero denominator is no fraction
    assert number_right("0.5", "1/2") and not number_right(None, "1") and not number_right("none", "1")
    mixed, notes = set_rows("crux+gsm+math", [crux_release(root, {"*": [crux_item(0, '{"answer": "[1, 2]"}')]})])
    assert [r.domain for r in mixed] == ["crux", "gsm", "gsm", "math-l5", "math-l5"] and set(notes) == {"crux", "gsm", "math-l5"}
    assert {r.domain: r.answer_kind for r in mixed} == {"crux": "text", "gsm": "number", "math-l5": "number"}
    (root / "result_dirs" / "gsm" / f"{CRUX_MODELS[0]}.json").write_text('[{"id": "x", "chat_history": ["q"], "output": ["a"]}]')
    with pytest.raises(ReleaseFormatError, match=r"result_dirs/gsm/Meta-Llama-3.1-8B-Instruct.json line 1: 'answer' is missing"):
        task_rows(root, "gsm")


def test_the_mixed_import_shares_its_workers_across_choice_and_code_rows(tmp_path):
    from fugu_pipeline.matrix.import_format import read_reward_jsonl, write_reward_jsonl

    rows, notes = set_rows("llmbar+humaneval", [llmbar_release(tmp_path / "llmbar"), humaneval_release(tmp_path / "he")])
    write_reward_jsonl(rows, tmp_path / "mixed.jsonl")
    assert len(read_reward_jsonl(tmp_path / "mixed.jsonl")) == len(rows)  # the import reads it back: no latency on any row
    assert len(rows) == 2 * len(LLMBAR_SUBSETS) + 164
    assert {tuple(r.worker_ids) for r in rows} == {("llama-2-family", "gpt-3.5-turbo", "gpt-4")}
    assert {r.domain: r.answer_kind for r in rows} == {"llmbar": "choice", "humaneval": "code"}
    assert rows[0].quality == [0.0, 0.0, 1.0]  # LLaMA2, ChatGPT, GPT-4 in the mixed order
    with pytest.raises(SystemExit, match="reads 2 release"):
        set_rows("llmbar+humaneval", [tmp_path / "llmbar"])


def test_a_bare_git_directory_reads_as_its_checkout(tmp_path):
    root = csqa_release(tmp_path / "re2")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "release"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(root), str(tmp_path / "bare")], check=True)
    from_checkout, _ = csqa_rows(root)
    from_bare, notes = csqa_rows(tmp_path / "bare")
    assert [r.model_dump() for r in from_bare] == [r.model_dump() for r in from_checkout] and len(notes["commit"]) == 40
    subprocess.run(["git", "-C", str(root), "rm", "-q", "prompter.py"], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "drop"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(root), str(tmp_path / "bare2")], check=True)
    with pytest.raises(FileNotFoundError, match="HEAD has no readable prompter.py .*Rereading-LLM-Reasoning"):
        csqa_rows(tmp_path / "bare2")


def test_the_table_scripts_take_a_set_by_name_and_its_release_folders():
    from argparse import Namespace
    from pathlib import Path

    from benchmarks.cascade_data import releases

    got = releases(Namespace(release=["llmbar=/r/LLMBar", "llmbar+humaneval=/r/LLMBar,/r/he"]))
    assert got == {"llmbar": [Path("/r/LLMBar")], "llmbar+humaneval": [Path("/r/LLMBar"), Path("/r/he")]}


def test_a_resplit_draws_half_test_a_tenth_val_by_its_seed_and_can_drop_the_domains():
    from benchmarks.reply_sets import resplit
    from fugu_pipeline.matrix.import_format import RewardRow

    rows = [RewardRow(task_id=f"t{i}", prompt=f"p{i}", domain="code" if i % 2 else "math", worker_ids=["a", "b"],
                      quality=[1.0, 0.0]) for i in range(101)]
    one, again, other = resplit(rows, 1, False), resplit(rows, 1, False), resplit(rows, 2, True)
    splits = [r.split for r in one]
    assert (splits.count("test"), splits.count("val"), splits.count("train")) == (50, 10, 41)
    assert splits == [r.split for r in again] and splits != [r.split for r in other]
    assert [r.domain for r in one] == [r.domain for r in rows] and {r.domain for r in other} == {"general"}
    assert [r.task_id for r in other] == [r.task_id for r in rows]
    assert resplit(rows, None, False) == rows

