"""Multiple-choice routing sets with several models' recorded replies, read where the releases lie
(a checkout or the bare git directory `fetch` gives; `benchmarks/release_files.py`); nothing is
copied into this repository. Each row carries every model's reply, its grade, a cost and the
options in the prompt (`answer_kind` "choice").

CommonsenseQA (five options), `csqa_rows(DIR)`: the re-reading study (Xu et al., "Re-Reading
Improves Reasoning in Large Language Models", EMNLP 2024), github.com/Tebmer/Rereading-LLM-Reasoning,
Apache-2.0. Its `results/` logs hold the 1,221 CommonsenseQA dev questions answered by
text-davinci-003, gpt-3.5-turbo (both September 2023) and gpt-4o-mini-2024-07-18, each with a
direct ("vanilla") and a chain-of-thought ("cot") reply, temperature 0 (`CSQA_FILES`: the baseline
runs, read once; `results/README.md` names them).
- Format read (JSON lines): `id` (int), `answerKey` (a letter), `question.stem`, `question.choices`
  (a list of `{label, text}`), and per act (`vanilla`, `cot`) `{generation: [reply], answer, score}`
  where `score` (0 or 1) is the study's verdict (its `\\boxed{}` letter against `answerKey`); the
  verdict is the quality here.
- Prompt: the study's (`prompter.py`): `TEXT_PROMPT_CHOIECES` with the stem and "Answer Choices:
  (A) ... (E) ...", then "A: " and the act's methodology line, read from the file as the MoT
  converter reads its few-shot prompt.
- Workers: each model's chain-of-thought reply (worker id the model); with `acts=("vanilla", "cot")`
  the direct replies are workers too (`<model>:direct`).

LLMBar (two options), `llmbar_rows(DIR)`: Zeng et al., "Evaluating Large Language Models at
Evaluating Instruction Following", ICLR 2024, github.com/princeton-nlp/LLMBar, MIT. 419 pairs of
outputs to an instruction (`Dataset/LLMBar/{Natural, Adversarial/{Neighbor,GPTInst,GPTOut,Manual}}`),
each judged by six models with the study's chain-of-thought comparison prompt: which of Output (a)
and Output (b) follows the instruction better.
- Format read: `dataset.json`, a JSON array of `{input, output_1, output_2, label (1 or 2)}`, and
  per evaluator `evaluators/<name>/CoT/result.json`, the same rows in the same order, each with
  `results[0]["swap = False"]` = `{completion: [reply, finish reason], winner: "1", "2" or null}`
  (the study's reading of the reply). Quality: `winner` equals `label`; null (no decision) is 0.
- Prompt: `LLMEvaluator/evaluators/prompts/comparison/CoT.txt` with its chat markers removed and
  `{input}`, `{output_1}`, `{output_2}` filled in.

Costs: the data has none, so a call costs (prompt chars / 4) input and (reply chars / 4) output
tokens at `PRICES` (USD per million tokens: the providers' list prices of the time; the open models
at a hosted price, an assumption marked there). A file or row not in the documented format is a
`ReleaseFormatError`, one line naming the file, the row's line and the field.
"""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.release_files import ReleaseFormatError, array_rows, call_cost, commit_of, field, jsonl_rows, read_file

PRICES = {  # (input, output) USD per million tokens
    "text-davinci-003": (20.0, 20.0), "gpt-3.5-turbo": (1.5, 2.0), "gpt-4o-mini": (0.15, 0.6),
    "gpt-3.5-turbo-0613": (1.5, 2.0), "gpt-3.5-turbo-0301": (2.0, 2.0), "gpt-4": (30.0, 60.0),
    "text-bison-001": (2.0, 2.0),  # PaLM 2: $0.0005 per 1,000 characters, at 4 characters a token
    "llama-2-70b-chat": (0.9, 0.9),  # assumed: a hosted 70B model's price
    "falcon-180b-chat": (1.8, 1.8),  # assumed: twice the hosted 70B price (2.6x the parameters)
}

RE2_REPO = "Tebmer/Rereading-LLM-Reasoning"
CSQA_FILES = {
    "text-davinci-003": "results/commonsenseqa_topp1.0_temp0.0_majority1_readtimes1_20230912_002205.jsonl",
    "gpt-3.5-turbo": "results/commonsenseqa_topp1.0_temp0.0_majority1_readtimes1_20230912_002124.jsonl",
    "gpt-4o-mini": "results/commonsenseqa_gpt-4o-mini-2024-07-18_topp1.0_temp0.0_majority1_readtimes1_20240926_224916.jsonl",
}
_RE2_FIX = f"restore the study's file (git checkout in {RE2_REPO}) or pass an untouched checkout of it"

LLMBAR_REPO = "princeton-nlp/LLMBar"
LLMBAR_SUBSETS = ("Natural", "Adversarial/Neighbor", "Adversarial/GPTInst", "Adversarial/GPTOut", "Adversarial/Manual")
LLMBAR_EVALUATORS = {"ChatGPT-0301": "gpt-3.5-turbo-0301", "ChatGPT": "gpt-3.5-turbo-0613", "PaLM2": "text-bison-001",
                     "LLaMA2": "llama-2-70b-chat", "Falcon": "falcon-180b-chat", "GPT-4": "gpt-4"}
LLMBAR_PROMPT = "LLMEvaluator/evaluators/prompts/comparison/CoT.txt"
_LLMBAR_FIX = f"restore the study's file (git checkout in {LLMBAR_REPO}) or pass an untouched checkout of it"


def _string_constants(root: Path, rel: str, names: tuple[str, ...]) -> dict:
    """The values of the module-level assignments `names` in a Python file of the release."""
    found = {}
    for node in ast.parse(read_file(root, rel, RE2_REPO)).body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if getattr(t, "id", None) in names:
                    found[t.id] = ast.literal_eval(node.value)
    missing = [n for n in names if n not in found]
    if missing:
        raise ReleaseFormatError(f"{rel}: no {', '.join(missing)}; {_RE2_FIX}")
    return found


def _csqa_item(row, rel: str, line: int, acts: tuple[str, ...]) -> dict:
    """A checked row of a CommonsenseQA log: its id, answer key, stem, choices and per act the reply and verdict."""
    def need(obj, name, want, path=""):
        return field(obj, name, want, rel, line, _RE2_FIX, path)

    q = need(row, "question", dict)
    choices = need(q, "choices", list, "question.")
    for c in choices:
        need(c, "label", str, "question.choices[].")
        need(c, "text", str, "question.choices[].")
    item = {"id": need(row, "id", int), "key": need(row, "answerKey", str), "stem": need(q, "stem", str, "question."),
            "choices": [(c["label"], c["text"]) for c in choices]}
    for act in acts:
        got = need(row, act, dict)
        gen = need(got, "generation", list, f"{act}.")
        if len(gen) != 1 or not isinstance(gen[0], str):
            raise ReleaseFormatError(f"{rel} line {line}: '{act}.generation' is not a list of one reply; {_RE2_FIX}")
        score = need(got, "score", (int, float), f"{act}.")
        if score not in (0, 1):
            raise ReleaseFormatError(f"{rel} line {line}: '{act}.score' is {score!r}, not 0 or 1; {_RE2_FIX}")
        item[act] = (gen[0], float(score))
    return item


def csqa_rows(root: Path, acts: tuple[str, ...] = ("cot",), test_fraction: float = 0.5, val_fraction: float = 0.1,
              seed: int = 0):
    """(rows, notes): one `RewardRow` per CommonsenseQA question every model answered (module docstring)."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    consts = _string_constants(root, "prompter.py", ("TEXT_PROMPT_CHOIECES", "act2methodology"))
    system = "You are a helpful assistant."  # prompter.Prompter.get_sys_message
    per_model = {}
    for m, rel in CSQA_FILES.items():
        items = [_csqa_item(row, rel, line, acts) for line, row in jsonl_rows(read_file(root, rel, RE2_REPO), rel, _RE2_FIX)]
        per_model[m] = {it["id"]: it for it in items}
    first = per_model[next(iter(CSQA_FILES))]
    workers = [(m if act == "cot" else f"{m}:direct", m, act) for act in acts for m in CSQA_FILES]
    rows = []
    for qid, it in first.items():
        if not all(qid in d for d in per_model.values()):
            continue
        question = it["stem"].strip() + " Answer Choices:" + "".join(f" ({lab}) {text}" for lab, text in it["choices"])
        body = consts["TEXT_PROMPT_CHOIECES"].format(question=question)
        replies, quality, cost, prompt = [], [], [], None
        for _, m, act in workers:
            text = body + f"\nA: {consts['act2methodology'][act]}"
            prompt = prompt or text
            reply, score = per_model[m][qid][act]
            replies.append(reply)
            quality.append(score)
            cost.append(call_cost(len(system) + len(text), len(reply), PRICES[m]))
        tid = f"csqa-{qid:04d}"
        rows.append(RewardRow(task_id=tid, prompt=prompt, domain="commonsenseqa", worker_ids=[w for w, _, _ in workers],
                              split=assign_split(tid, seed, test_fraction, val_fraction), quality=quality,
                              cost_usd=cost, answers=replies, answer_kind="choice", tags=[f"answer:{it['key']}"]))
    notes = {"source": RE2_REPO, "commit": commit_of(root), "files": CSQA_FILES, "acts": list(acts),
             "questions": len(rows), "prices_usd_per_m_tokens": {m: PRICES[m] for m in CSQA_FILES}}
    return rows, notes


def llmbar_prompt(root: Path) -> str:
    """The study's chain-of-thought comparison prompt, its chat markers removed."""
    text = read_file(root, LLMBAR_PROMPT, LLMBAR_REPO)
    for marker in ("<|im_start|>system\n", "<|im_start|>user\n", "<|im_end|>"):
        text = text.replace(marker, "")
    if not all(k in text for k in ("{input}", "{output_1}", "{output_2}")):
        raise ReleaseFormatError(f"{LLMBAR_PROMPT}: lacks {{input}}, {{output_1}} or {{output_2}}; {_LLMBAR_FIX}")
    return text.strip()


def _llmbar_judgement(row, rel: str, line: int) -> tuple[str, str | None]:
    """(reply, winner) of an evaluator's row, unswapped order."""
    results = field(row, "results", list, rel, line, _LLMBAR_FIX)
    first = results[0] if results and isinstance(results[0], dict) else {}
    got = field(first, "swap = False", dict, rel, line, _LLMBAR_FIX)
    completion = field(got, "completion", list, rel, line, _LLMBAR_FIX)
    if not completion or not isinstance(completion[0], str):
        raise ReleaseFormatError(f"{rel} line {line}: 'completion' holds no reply text; {_LLMBAR_FIX}")
    winner = got.get("winner")
    if winner not in ("1", "2", None):
        raise ReleaseFormatError(f"{rel} line {line}: 'winner' is {winner!r}, not \"1\", \"2\" or null; {_LLMBAR_FIX}")
    return completion[0], winner


def llmbar_rows(root: Path, evaluators: dict[str, str] | None = None, test_fraction: float = 0.5,
                val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per LLMBar pair, every evaluator's reply (module docstring).
    `evaluators`: {the study's folder name: worker id} (default `LLMBAR_EVALUATORS`, priced as the
    model `LLMBAR_EVALUATORS` names)."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    evaluators = evaluators or LLMBAR_EVALUATORS
    template = llmbar_prompt(root)
    rows = []
    for subset in LLMBAR_SUBSETS:
        rel = f"Dataset/LLMBar/{subset}/dataset.json"
        pairs = []
        for line, row in array_rows(read_file(root, rel, LLMBAR_REPO), rel, _LLMBAR_FIX):
            pair = {k: field(row, k, str, rel, line, _LLMBAR_FIX) for k in ("input", "output_1", "output_2")}
            pair["label"] = field(row, "label", int, rel, line, _LLMBAR_FIX)
            if pair["label"] not in (1, 2):
                raise ReleaseFormatError(f"{rel} line {line}: 'label' is {pair['label']}, not 1 or 2; {_LLMBAR_FIX}")
            pairs.append(pair)
        judged = {}
        for name in evaluators:
            res = f"Dataset/LLMBar/{subset}/evaluators/{name}/CoT/result.json"
            got = array_rows(read_file(root, res, LLMBAR_REPO), res, _LLMBAR_FIX)
            if len(got) != len(pairs):
                raise ReleaseFormatError(f"{res}: {len(got)} rows for the {len(pairs)} of {rel}; {_LLMBAR_FIX}")
            for (line, row), pair in zip(got, pairs):
                if field(row, "input", str, res, line, _LLMBAR_FIX) != pair["input"]:
                    raise ReleaseFormatError(f"{res} line {line}: 'input' differs from the same row of {rel}; {_LLMBAR_FIX}")
            judged[name] = [_llmbar_judgement(row, res, line) for line, row in got]
        for k, pair in enumerate(pairs):
            prompt = template.replace("{input}", pair["input"]).replace("{output_1}", pair["output_1"]).replace(
                "{output_2}", pair["output_2"])
            replies = [judged[name][k][0] for name in evaluators]
            quality = [float(judged[name][k][1] == str(pair["label"])) for name in evaluators]
            cost = [call_cost(len(prompt), len(r), PRICES[LLMBAR_EVALUATORS[name]]) for r, name in zip(replies, evaluators)]
            tid = f"llmbar-{subset.lower().replace('/', '-')}-{k:03d}"
            rows.append(RewardRow(task_id=tid, prompt=prompt, domain="llmbar", worker_ids=list(evaluators.values()),
                                  split=assign_split(tid, seed, test_fraction, val_fraction), quality=quality,
                                  cost_usd=cost, answers=replies, answer_kind="choice",
                                  tags=[f"subset:{subset}", f"answer:{'AB'[pair['label'] - 1]}"]))
    notes = {"source": LLMBAR_REPO, "commit": commit_of(root), "subsets": list(LLMBAR_SUBSETS),
             "evaluators": evaluators, "prompt": LLMBAR_PROMPT, "pairs": len(rows),
             "prices_usd_per_m_tokens": {w: PRICES[LLMBAR_EVALUATORS[n]] for n, w in evaluators.items()}}
    return rows, notes
