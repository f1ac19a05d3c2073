"""`examples_passed` / `examples_failed`: a code reply run, in the sandbox, on the examples its own
prompt gives; read from the prompt in every common form, kept in the cache, the same offline and live,
and what it lets a verifier tell."""

from __future__ import annotations

import numpy as np
import pytest

import fugu_pipeline.policies.cascade.code_examples as ce
from fugu_pipeline.policies.cascade.answer_features import STATS, TEXT_STATS, reply_statistics, trained_stats
from fugu_pipeline.policies.cascade.code_examples import EXECUTED_STATS, examples_stats, prompt_examples

HUMANEVAL = '''```python
def below_zero(operations: list) -> bool:
    """ Detect if the balance falls below zero.
    >>> below_zero([1, 2, 3])
    False
    >>> below_zero([1, 2, -4, 5])
    True
    """
```
Return the complete code.'''
MBPP = ("Write a function to find the shared elements of two lists. Your code should pass these tests:\n\n"
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"
        "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))")
ARROWS = ("Write `add_one(x)`, which adds one.\ndef add_one(x):\n    pass\nExamples:\nadd_one(1) ➞ 2\n"
          "add_one(-1) == 0\n* add_one(9) should return 10.\nadd_one(( ➞ 3")
RIGHT_BELOW = "def below_zero(operations):\n    b = 0\n    for o in operations:\n        b += o\n        if b < 0:\n            return True\n    return False"
WRONG_BELOW = "def below_zero(operations):\n    return sum(operations) < 0"


def test_examples_are_read_in_each_form():
    assert prompt_examples(HUMANEVAL) == ("below_zero", (("below_zero([1, 2, 3])", "False"), ("below_zero([1, 2, -4, 5])", "True")))
    entry, got = prompt_examples(MBPP)
    assert entry == "similar_elements" and [k for k, _ in got] == ["assert", "assert"]  # `set` is not the function
    # the `def` line's `-> bool` is no example, nor a call that does not parse
    assert prompt_examples(ARROWS) == ("add_one", (("add_one(1)", "2"), ("add_one(-1)", "0"), ("add_one(9)", "10")))
    assert prompt_examples("What is 2 + 2? Answer with a number.") == (None, ())
    question = "Complete the assertion with the output.\ndef f(nums):\n    return nums[::-1]\nassert f([1, 2]) == ??"
    assert prompt_examples(question) == ("f", ())  # the question's assert is no example
    many = "def f(x):\n    pass\n" + "".join(f"f({i}) == {i}\n" for i in range(30))
    assert len(prompt_examples(many)[1]) == ce.MAX_EXAMPLES


FEW_SHOT = ("Your task: find the shared elements. Your code should pass these tests:\n"
            "assert similar_elements((3, 4), (4, 5)) == (4,)\n[BEGIN]\n'def similar_elements(a, b): ...'\n[DONE]\n"
            "Your task: identify non-prime numbers. Your code should pass these tests:\n"
            "assert is_not_prime(2) == False\nassert is_not_prime(10) == True\nassert is_not_prime(35) == True\n")


def test_a_few_shot_prompt_asks_for_its_last_task_and_code_among_words_is_found():
    entry, got = prompt_examples(FEW_SHOT)
    assert entry == "is_not_prime" and len(got) == 3  # not the worked example's function
    right = "def is_not_prime(n):\n    return any(n % k == 0 for k in range(2, n))"
    wrapped = [f"[BEGIN]\n{right}\n[DONE]",  # compiles as it is (`[BEGIN]` is a list), and fails at its first line
               f"Here is the function:\n{right}\nIt checks every divisor.",
               "Here is the function:\ndef is_not_prime(n):\n    return n > 100\nIt checks every divisor."]
    got = examples_stats([(w, None, FEW_SHOT) for w in wrapped])
    assert got[:2].tolist() == [[1, 0], [1, 0]] and np.allclose(got[2], [1 / 3, 2 / 3])  # 2 is not > 100: one passes


# TransCoder's form: worked translations that define their own functions, then the C++ function to
# translate and its test; the last function the prompt defines is a worked example's, not the task's
TRANSLATE = ("[c++]\nint square(int x) { return x * x; }\n[python]\ndef square(x):\n    return x * x\n"
             "[c++]\nint add_one(int x) { return x + 1; }\n[python]\n\nYour code should pass this test:\n"
             "assert add_one(20) == 21")


def test_a_prompt_that_defines_its_worked_examples_asks_for_the_function_its_test_calls():
    assert prompt_examples(TRANSLATE) == ("add_one", (("assert", "assert add_one(20) == 21"),))
    right, wrong = "def add_one(x):\n    return x + 1\n", "def add_one(x):\n    return x * x\n"
    assert examples_stats([(right, None, TRANSLATE), (wrong, None, TRANSLATE)]).tolist() == [[1, 0], [0, 1]]
    # a prompt whose examples are its docstring's reads the function it defines, as before
    assert prompt_examples(HUMANEVAL)[0] == "below_zero"
    # what a plan's examples rule stops on: every example passed; a prompt that shows none passes nothing
    assert ce.passes_all(np.array([[1, 0], [0, 0], [0.5, 0.5], [0, 1]], np.float32)).tolist() == [True, False, False, False]


def test_right_code_passes_wrong_code_fails_and_no_examples_reads_as_before(tmp_path):
    cells = [(RIGHT_BELOW, None, HUMANEVAL), (WRONG_BELOW, None, HUMANEVAL),
             ("def similar_elements(a, b):\n    return set(a) & set(b)", None, MBPP),
             ("Here is the code:\n```python\n" + RIGHT_BELOW + "\n```", None, HUMANEVAL),  # fenced, with words around
             ("I cannot help with that.", None, HUMANEVAL), (None, None, HUMANEVAL), ("4", "4", "What is 2 + 2?")]
    got = examples_stats(cells, tmp_path)
    assert got.tolist() == [[1, 0], [0.5, 0.5], [1, 0], [1, 0], [0, 1], [0, 0], [0, 0]]


def test_a_reply_cannot_print_its_way_to_a_pass():
    forged = WRONG_BELOW + "\nprint('fugu-examples-0000 [2, 2]')\nimport sys\nprint('fugu-examples [2, 2]', file=sys.stdout)"
    assert examples_stats([(forged, None, HUMANEVAL)]).tolist() == [[0.5, 0.5]]


def test_a_runaway_reply_fails_without_running(monkeypatch):
    from fugu_pipeline.collect import sandbox

    monkeypatch.setattr(sandbox, "run_untrusted", lambda *a, **k: pytest.fail("a runaway reply was run"))
    huge = RIGHT_BELOW + "\n" + "# more\n" * (ce.MAX_REPLY_CHARS // 7)
    assert examples_stats([(huge, None, HUMANEVAL)]).tolist() == [[0, 1]]


def test_code_that_never_ends_is_stopped_and_fails(monkeypatch):
    monkeypatch.setattr(ce, "TIMEOUT_S", 1.0)
    assert examples_stats([("def below_zero(o):\n    while True:\n        pass", None, HUMANEVAL)]).tolist() == [[0, 1]]


def test_runs_are_kept_by_content_and_a_sandbox_error_is_not(tmp_path, monkeypatch):
    cells = [(RIGHT_BELOW, None, HUMANEVAL), (WRONG_BELOW, None, HUMANEVAL)]
    first = examples_stats(cells, tmp_path)
    calls = []
    monkeypatch.setattr(ce, "_run", lambda reply, prompt: calls.append(reply) or None)  # None: the sandbox failed
    assert np.array_equal(examples_stats(cells), first) and calls == []  # this process remembers them
    ce._RECENT.clear()
    assert np.array_equal(examples_stats(cells, tmp_path), first) and calls == []  # read back from disk, nothing run
    assert np.array_equal(examples_stats(cells), first) and calls == []  # and remembered again
    other = [("def below_zero(o):\n    return False", None, HUMANEVAL)]
    assert examples_stats(other, tmp_path).tolist() == [[0, 0]] and len(calls) == 1  # unknown: as no examples
    assert examples_stats(other, tmp_path).tolist() == [[0, 0]] and len(calls) == 2  # and not kept: tried again


def test_at_most_the_slots_run_at_once(monkeypatch):
    """However many threads ask (a training pool, requests served at once), no more sandboxes than
    the slots run together: with two slots, six runs meet two at a time at a barrier of two."""
    import threading

    from fugu_pipeline.collect import sandbox

    monkeypatch.setattr(ce, "_SLOTS", threading.BoundedSemaphore(2))
    barrier, lock, active, most = threading.Barrier(2, timeout=30), threading.Lock(), [0], [0]
    real = sandbox.run_untrusted

    def counted(code, test, limits):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        barrier.wait()  # two at a time pass; a third at once would show in `most`
        try:
            return real(code, test, limits)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(sandbox, "run_untrusted", counted)
    cells = [(f"def below_zero(o):\n    return {k} < 0", None, HUMANEVAL) for k in range(6)]
    got = examples_stats(cells, threads=6)
    assert most[0] == 2 and got.shape == (6, 2) and (got.sum(axis=1) == 1).all()


def test_offline_and_live_read_the_same_values(tmp_path):
    """Training reads them through `reply_statistics` with the cache; `route` runs them first, outside
    its lock, and hands them to `reply_stats`: the same columns."""
    from fugu_pipeline.policies.cascade.cross_encoder_use import reply_stats

    names = [n for n in STATS if n != "option_fit"]
    replies = [(RIGHT_BELOW, None), (WRONG_BELOW, None), ("no code", None)]
    offline = reply_statistics([(r, f, HUMANEVAL) for r, f in replies], names, None, tmp_path)
    live = reply_stats(HUMANEVAL, replies, names, None, None, examples_stats([(r, f, HUMANEVAL) for r, f in replies]))
    assert np.array_equal(offline, live)
    at = [names.index(n) for n in EXECUTED_STATS]
    assert offline[:, at].tolist() == [[1, 0], [0.5, 0.5], [0, 1]]
    assert trained_stats(False) == tuple(n for n in STATS if n not in EXECUTED_STATS) and trained_stats() == STATS


@pytest.mark.slow  # 120 sandbox runs
def test_a_verifier_tells_right_code_from_wrong_only_by_running_it():
    """Replies whose text looks alike (one operator differs): the text statistics see nothing, the
    runs on the prompt's examples separate them, out of fold."""
    from fugu_pipeline.policies.cascade.verifier import VerifierInputs, auc, oof_scores
    from fugu_pipeline.train.selection import fold_ids

    rng = np.random.default_rng(0)
    cells, right = [], []
    for i in range(120):
        a, b = (int(x) for x in rng.integers(2, 9, 2))
        prompt = f'def f{i}(x):\n    """Return x * {a} + {b}.\n    >>> f{i}(1)\n    {a + b}\n    >>> f{i}(2)\n    {2 * a + b}\n    """'
        ok = bool(rng.random() < 0.6)
        cells.append((f"def f{i}(x):\n    return x * {a} {'+' if ok else '-'} {b}", None, prompt))
        right.append(float(ok))
    right = np.array(right)
    stats = reply_statistics(cells, TEXT_STATS + EXECUTED_STATS, None)
    folds = fold_ids([f"t{i}" for i in range(len(cells))])

    def oof_auc(names):
        cols = [(TEXT_STATS + EXECUTED_STATS).index(s) for s in names]
        inp = VerifierInputs(prompt=np.zeros((len(cells), 1), np.float32), answer=stats[:, None, cols],
                             has=np.ones((len(cells), 1), bool), target=right[:, None], stat_names=tuple(names))
        scores, _, _ = oof_scores(inp, folds, l2_grid=(0.01,), input_sets=("stats",))
        return auc(scores[:, 0], right >= 0.5)

    assert oof_auc(TEXT_STATS) < 0.7
    assert oof_auc(TEXT_STATS + EXECUTED_STATS) > 0.95
