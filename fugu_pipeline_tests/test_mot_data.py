"""The reader of the answer-consistency cascade study's released replies (benchmarks/mot_data.py,
MurongYue/LLM_MoT_cascade), on a hand-made tiny folder in the study's layout and format: the
few-shot prompt from its Python file, each model's replies cut at the first blank line and graded
by their last "A:" line against the reference (a string, or the option marked 1), the cost from
characters at the listed prices, questions every model answered only; a checkout and a bare git
directory read alike; a malformed file or row is one line naming the file, the row's line and the field."""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks.mot_data import PRICES, TASKS, MotFormatError, mot_rows

SHOTS = "\nQ: Today is 12/24/1937. What is the date tomorrow in MM/DD/YYYY?\nA: 12/25/1937\n"
Q1 = "Yesterday was April 30, 2021. What is the date today in MM/DD/YYYY?"
Q2 = "Today is 3/5. What is the date 10 days ago in MM/DD/YYYY? (year 2020)"
Q3 = "Only two of the three models answered this one."
FILES = TASKS["date"]["workers"]


def study(root, llama=None, gpt3=None, gpt4=None):
    """A checkout of the study's layout: the prompt file and the three result files (JSON arrays,
    indented as released)."""
    prompt = root / "Evaluation" / "prompting" / "date.py"
    prompt.parent.mkdir(parents=True)
    prompt.write_text(f"other = 1\ndate_CoT1_prompting = {SHOTS!r}\n")
    llama = llama if llama is not None else [  # the reference as the option marked 1, sometimes as its Python literal
        {"question": Q1, "answer": {"05/01/2021": 1, "04/29/2021": 0},
         "generated": ["Explain: today is May 1.\nA: 05/01/2021\n\nQ: Invented next question?\nA: 01/01/2000", "unused"]},
        {"question": Q2, "answer": str({"02/24/2020": 1, "02/25/2020": 0}), "generated": str(["Explain: guess.\nA: 02/25/2020"])},
        {"question": Q3, "answer": {"01/01/2001": 1}, "generated": ["A: 01/01/2001"]},
    ]
    gpt3 = gpt3 if gpt3 is not None else [
        {"question": Q1, "answer": "05/01/2021", "generated": ["Explain: one day after.\nA: 04/30/2021\nA: 05/01/2021"]},
        {"question": Q2, "answer": "02/24/2020", "generated": ["Explain: no answer line here."]},
        {"question": Q3, "answer": "01/01/2001", "generated": ["A: 01/01/2001"]},
    ]
    gpt4 = gpt4 if gpt4 is not None else [
        {"question": Q2, "answer": "02/24/2020", "generated": ["Explain: 10 days before 03/05/2020.\nA:  02/24/2020 "]},
        {"question": Q1, "answer": "05/01/2021", "generated": ["A: 5/1/2021"]},  # right date, not the reference's string
    ]
    for rows, rel in ((llama, FILES["llama-2-13b"]), (gpt3, FILES["gpt-3.5-turbo"]), (gpt4, FILES["gpt-4"])):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rows if isinstance(rows, str) else json.dumps(rows, indent=4))
    return root


def cost(worker: str, question: str, reply: str) -> float:
    p_in, p_out = PRICES[worker]
    return ((len(SHOTS) + len(question)) / 4 * p_in + len(reply) / 4 * p_out) / 1e6


def test_rows_hold_every_models_cut_reply_its_grade_and_cost(tmp_path):
    rows, notes = mot_rows(study(tmp_path / "mot"))
    assert [r.prompt for r in rows] == [Q1, Q2]  # the first file's order; Q3 lacks gpt-4's reply
    assert all(r.worker_ids == ["llama-2-13b", "gpt-3.5-turbo", "gpt-4"] and r.domain == "date" for r in rows)
    one, two = rows
    assert one.answers[0] == "Explain: today is May 1.\nA: 05/01/2021"  # cut at the blank line: the invented question is gone
    assert one.quality == [1.0, 1.0, 0.0]  # the last "A:" line counts; 5/1/2021 is not the string 05/01/2021
    assert two.quality == [0.0, 0.0, 1.0]  # wrong option; no "A:" line; surrounding spaces ignored
    assert one.cost_usd == pytest.approx([cost(w, Q1, a) for w, a in zip(one.worker_ids, one.answers)], rel=1e-12)
    assert two.cost_usd[2] == pytest.approx(cost("gpt-4", Q2, "Explain: 10 days before 03/05/2020.\nA:  02/24/2020"))
    assert [r.task_id for r in rows] == ["mot-date-0000", "mot-date-0001"] and {r.split for r in rows} <= {"train", "val", "test"}
    assert notes["questions"] == 2 and notes["few_shot_chars"] == len(SHOTS) and notes["commit"] is None


def test_a_bare_git_directory_reads_as_its_checkout(tmp_path):
    root = study(tmp_path / "mot")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "release"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(root), str(tmp_path / "bare")], check=True)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    from_checkout, notes = mot_rows(root)
    from_bare, bare_notes = mot_rows(tmp_path / "bare")
    assert [r.model_dump() for r in from_bare] == [r.model_dump() for r in from_checkout]
    assert notes["commit"] == bare_notes["commit"] == head


def _line_of_row(text: str, k: int) -> int:
    """The 1-based line the k-th row of an indented JSON array starts on."""
    starts = [n for n, line in enumerate(text.splitlines(), 1) if line == "    {"]
    return starts[k]


@pytest.mark.parametrize("bad, field, why", [
    ({"question": Q2, "answer": "02/24/2020"}, "'generated'", "is missing"),
    ({"question": Q2, "answer": "02/24/2020", "generated": "['unclosed"}, "'generated'", "is not a readable literal"),
    ({"question": Q2, "answer": "02/24/2020", "generated": [7]}, "'generated'", "holds a reply that is not a string"),
    ({"question": "", "answer": "02/24/2020", "generated": []}, "'question'", "is not a non-empty string"),
    ({"question": Q2, "answer": {"02/24/2020": 0}, "generated": []}, "'answer'", "marks no option as the right one"),
])
def test_a_malformed_row_names_the_file_its_line_and_the_field(tmp_path, bad, field, why):
    rows = [{"question": Q1, "answer": "05/01/2021", "generated": ["A: 05/01/2021"]}, bad]
    root = study(tmp_path / "mot", gpt3=rows)
    line = _line_of_row((root / FILES["gpt-3.5-turbo"]).read_text(), 1)
    with pytest.raises(MotFormatError) as got:
        mot_rows(root)
    msg = str(got.value)
    assert msg.startswith(f"{FILES['gpt-3.5-turbo']} line {line}: {field} {why}") and "\n" not in msg
    assert "LLM_MoT_cascade" in msg  # what to do: an untouched copy of the study's file


def test_a_file_that_is_not_json_names_the_line(tmp_path):
    text = json.dumps([{"question": Q1, "answer": "05/01/2021", "generated": ["A: 05/01/2021"]}], indent=4)
    broken = text.replace('"answer": "05/01/2021",', '"answer": "05/01/2021"')  # a comma lost on line 4
    root = study(tmp_path / "mot", gpt4=broken)
    with pytest.raises(MotFormatError, match=rf"^{FILES['gpt-4']} line 5: not JSON \(Expecting ',' delimiter\)"):
        mot_rows(root)
    (root / FILES["gpt-4"]).write_text('{"question": "an object, not an array"}')
    with pytest.raises(MotFormatError, match=rf"^{FILES['gpt-4']} line 1: not a JSON array of rows"):
        mot_rows(root)
