"""The public routing sets with several models' recorded replies, by name, and the command that
writes one as a reward-matrix import JSONL (`answers`, `quality`, `cost_usd`, `domain`, splits: 50%
test, 10% val by a hash of the task id), read where the releases lie (nothing is copied here), and
prints each worker's accuracy, mean $ per 1,000 requests, and how many of its replies the cascades'
final-answer reader reads an answer from:

    python benchmarks/reply_sets.py csqa <Tebmer/Rereading-LLM-Reasoning dir> --out csqa.jsonl
    python benchmarks/reply_sets.py csqa+direct <Tebmer/Rereading-LLM-Reasoning dir> --out csqa6.jsonl  # + direct replies
    python benchmarks/reply_sets.py llmbar <princeton-nlp/LLMBar dir> --out llmbar.jsonl
    python benchmarks/reply_sets.py humaneval <jamesmurdza/humaneval-results dir> --out humaneval.jsonl \\
        [--regrade /work/shared/data/tasks/humaneval/HumanEval.jsonl.gz]
    python benchmarks/reply_sets.py humaneval <jamesmurdza/humaneval-results dir> --out he2.jsonl --keep codellama-34b-instruct,gpt-4
    python benchmarks/reply_sets.py mbpp <zaiyichen0411/MapCoder-Reproduction dir> --out mbpp.jsonl [--regrade]
    python benchmarks/reply_sets.py ldb <FloridSleeves/LLMDebugger dir> --out ldb.jsonl [--regrade]
    python benchmarks/reply_sets.py crux <WildEval/ZeroEval dir> --out crux.jsonl
    python benchmarks/reply_sets.py gsm <WildEval/ZeroEval dir> --out gsm.jsonl
    python benchmarks/reply_sets.py math-l5 <WildEval/ZeroEval dir> --out math.jsonl
    python benchmarks/reply_sets.py crux+gsm+math <WildEval/ZeroEval dir> --out zeroeval-mix.jsonl
    python benchmarks/reply_sets.py crux+gsm+math <WildEval/ZeroEval dir> --out s1.jsonl --resplit 1 --no-domains
    python benchmarks/reply_sets.py llmbar+humaneval <LLMBar dir> <humaneval-results dir> --out mixed.jsonl
    python benchmarks/reply_sets.py mot-date <MurongYue/LLM_MoT_cascade dir> --out date.jsonl

A "dir" is a checkout of the repository or its bare git directory (what `fetch` gives). What each
converter reads, how it grades and prices: `choice_sets.py` (csqa, llmbar), `code_sets.py`
(humaneval, mbpp, ldb), `zeroeval_sets.py` (crux, gsm, math-l5), `mot_data.py` (mot-date).

`llmbar+humaneval` is a mixed import (multiple choice and code, `domain` llmbar or humaneval) with
the workers both releases share: gpt-3.5-turbo and gpt-4 (LLMBar's ChatGPT-0613 and GPT-4 judged
in 2023; the HumanEval traces are gpt-3.5-turbo and gpt-4 of July 2023), and `llama-2-family`, the
open model of each release: Llama-2-70b-chat on the LLMBar rows, CodeLlama-34b-Instruct on the
HumanEval rows (one worker that sends each domain to its own open model). It carries no latency
(LLMBar recorded none, and an import gives every row its latency or none).

`crux+gsm+math` is a mixed import from one release (code reasoning, grade-school and competition
math; `domain` crux, gsm or math-l5) with six workers from Llama-3.1-8B to Claude 3.5 Sonnet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIXED_LLMBAR = {"LLaMA2": "llama-2-family", "ChatGPT": "gpt-3.5-turbo", "GPT-4": "gpt-4"}
MIXED_HUMANEVAL = {"codellama-34b-instruct": "llama-2-family", "gpt-3.5-turbo": "gpt-3.5-turbo", "gpt-4": "gpt-4"}


def _csqa(dirs, **kw):
    from benchmarks.choice_sets import csqa_rows

    return csqa_rows(dirs[0], **kw)


def _csqa_direct(dirs, **kw):
    from benchmarks.choice_sets import csqa_rows

    return csqa_rows(dirs[0], acts=("vanilla", "cot"), **kw)


def _llmbar(dirs, **kw):
    from benchmarks.choice_sets import llmbar_rows

    return llmbar_rows(dirs[0], **kw)


def _humaneval(dirs, **kw):
    from benchmarks.code_sets import humaneval_rows

    return humaneval_rows(dirs[0], **kw)


def _mbpp(strategy):
    def build(dirs, **kw):
        from benchmarks.code_sets import mbpp_rows

        return mbpp_rows(dirs[0], strategy, **kw)

    return build


def _ldb(dirs, **kw):
    from benchmarks.code_sets import ldb_rows

    return ldb_rows(dirs[0], **kw)


def _zeroeval(task):
    def build(dirs, **kw):
        from benchmarks.zeroeval_sets import task_rows

        return task_rows(dirs[0], task, **kw)

    return build


def _zeroeval_mix(dirs, **kw):
    from benchmarks.zeroeval_sets import mixed_rows

    return mixed_rows(dirs[0], **kw)


def _mot_date(dirs, **kw):
    from benchmarks.mot_data import mot_rows

    return mot_rows(dirs[0], "date", **kw)


def _llmbar_humaneval(dirs, **kw):
    from benchmarks.choice_sets import llmbar_rows
    from benchmarks.code_sets import humaneval_rows

    choice, choice_notes = llmbar_rows(dirs[0], evaluators=MIXED_LLMBAR, **kw)
    code, code_notes = humaneval_rows(dirs[1], models=tuple(MIXED_HUMANEVAL), names=MIXED_HUMANEVAL, **kw)
    for r in code:  # LLMBar recorded no latency: an import gives every row its latency or none
        r.latency_s = None
    return choice + code, {"llmbar": choice_notes, "humaneval": code_notes, "workers": list(MIXED_LLMBAR.values())}


# name -> (the release directories it reads, the builder)
SETS = {
    "csqa": (("Tebmer/Rereading-LLM-Reasoning",), _csqa),
    "csqa+direct": (("Tebmer/Rereading-LLM-Reasoning",), _csqa_direct),
    "llmbar": (("princeton-nlp/LLMBar",), _llmbar),
    "humaneval": (("jamesmurdza/humaneval-results",), _humaneval),
    "mbpp": (("zaiyichen0411/MapCoder-Reproduction",), _mbpp("CoT")),
    "ldb": (("FloridSleeves/LLMDebugger",), _ldb),
    "crux": (("WildEval/ZeroEval",), _zeroeval("crux")),
    "gsm": (("WildEval/ZeroEval",), _zeroeval("gsm")),
    "math-l5": (("WildEval/ZeroEval",), _zeroeval("math-l5")),
    "crux+gsm+math": (("WildEval/ZeroEval",), _zeroeval_mix),
    "llmbar+humaneval": (("princeton-nlp/LLMBar", "jamesmurdza/humaneval-results"), _llmbar_humaneval),
    "mot-date": (("MurongYue/LLM_MoT_cascade",), _mot_date),
}


def set_rows(name: str, dirs: list[Path], regrade: Path | bool | None = None, **kw):
    """(rows, notes) of the set `name` read from `dirs` (one per release `SETS` names); `regrade`:
    grade the code rows again with the project's code grader, HumanEval's against its task file (the
    path), MBPP's and LDB's against the asserts their release holds (True)."""
    if name not in SETS:
        raise SystemExit(f"unknown set {name!r}; one of {', '.join(SETS)}")
    repos, build = SETS[name]
    if len(dirs) != len(repos):
        raise SystemExit(f"{name} reads {len(repos)} release(s): {', '.join(repos)}; got {len(dirs)} folder(s)")
    in_release = {"mbpp": "MBPP", "ldb": "LDB"}  # sets whose release holds their tests
    if regrade is not None:  # before the release is read: a wrong flag costs nothing
        if not any(d in ("humaneval", *in_release) for d in name.split("+")):
            raise SystemExit(f"--regrade grades HumanEval, MBPP or LDB replies; {name} has none")
        if "humaneval" in name.split("+") and not isinstance(regrade, Path):
            raise SystemExit("--regrade: pass HumanEval's task file (HumanEval.jsonl.gz) to grade against its tests")
        if name in in_release and regrade is not True:
            raise SystemExit(f"--regrade: {in_release[name]}'s tests are in its release; give --regrade without a file")
    rows, notes = build([Path(d) for d in dirs], **kw)
    if regrade is not None:
        from benchmarks.code_sets import humaneval_tasks, ldb_tasks, mbpp_tasks
        from benchmarks.code_sets import regrade as grade_again

        if name in in_release:
            graded, tasks = rows, (mbpp_tasks if name == "mbpp" else ldb_tasks)(Path(dirs[0]))
        else:
            graded, tasks = [r for r in rows if r.domain == "humaneval"], humaneval_tasks(regrade)
        notes = {**notes, "regraded": grade_again(graded, tasks)}
    return rows, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=list(SETS))
    ap.add_argument("dirs", nargs="+", type=Path, help="the release's checkout or git directory (two for llmbar+humaneval)")
    ap.add_argument("--out", type=Path, required=True, help="the reward-matrix JSONL to write")
    ap.add_argument("--regrade", type=Path, nargs="?", const=True, default=None, metavar="HUMANEVAL_TASKS",
                    help="grade the code replies again with the project's sandboxed grader: HumanEval's against its "
                         "task file (the path), MBPP's and LDB's against the asserts of their release (no path)")
    ap.add_argument("--resplit", type=int, default=None, metavar="SEED",
                    help="split the same rows at random instead (numpy's default_rng(SEED).permutation of the rows in "
                         "the release's order: the first half test, the next tenth val, the rest train)")
    ap.add_argument("--keep", default=None, metavar="W1,W2",
                    help="keep only these workers (comma-separated, as the summary names them), in the release's order "
                         "(what `fugu-lite import jsonl --workers` does to a written file)")
    ap.add_argument("--no-domains", action="store_true",
                    help="write every row in one domain (general), as an import that names no kinds of prompt")
    args = ap.parse_args()
    from fugu_pipeline.matrix.import_format import write_reward_jsonl

    from benchmarks.release_files import ReleaseFormatError

    try:
        rows, notes = set_rows(args.name, args.dirs, args.regrade)
    except (ReleaseFormatError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 1
    rows = resplit(rows, args.resplit, args.no_domains)
    if args.keep is not None:
        from fugu_pipeline.matrix.import_format import keep_workers, worker_names

        try:
            rows = keep_workers(rows, worker_names(args.keep))
        except ValueError as exc:
            print(f"--keep: {exc}", file=sys.stderr)
            return 2
    write_reward_jsonl(rows, args.out)
    print(f"{args.out}: {len(rows)} rows x {len(rows[0].worker_ids)} workers; {notes}")
    print("\n".join(summary_lines(rows)))
    return 0


def resplit(rows: list, seed: int | None, no_domains: bool) -> list:
    """The rows split at random by `seed` (`--resplit`), and in one domain (`--no-domains`)."""
    import numpy as np

    split = {}
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(rows))
        n = len(rows)
        split = {int(i): ("test" if k < n // 2 else "val" if k < n // 2 + n // 10 else "train") for k, i in enumerate(order)}
    return [r.model_copy(update={**({"split": split[i]} if split else {}), **({"domain": "general"} if no_domains else {})})
            for i, r in enumerate(rows)]


def summary_lines(rows: list) -> list[str]:
    """Per worker, over every row, the non-test rows (what training sees) and per domain: accuracy and
    mean $ per 1,000 requests; then on how many rows the cascades' final-answer reader
    (`tasks/final_answer.extract`, by the row's `answer_kind`) reads an answer from the reply."""
    out = ["| rows | n | " + " | ".join(rows[0].worker_ids) + " |", "|---|---|" + "---|" * len(rows[0].worker_ids)]
    domains = sorted({r.domain for r in rows}) if len({r.domain for r in rows}) > 1 else []
    parts = [("all", rows), ("non-test", [r for r in rows if r.split != "test"]),
             *((f"domain {d}", [r for r in rows if r.domain == d]) for d in domains)]
    for name, sel in parts:
        cells = [f"{sum(r.quality[j] for r in sel) / len(sel):.4f} (${1000 * sum(r.cost_usd[j] for r in sel) / len(sel):.4g})"
                 for j in range(len(rows[0].worker_ids))]
        out.append(f"| {name} | {len(sel)} | " + " | ".join(cells) + " |")
    from fugu_pipeline.tasks.final_answer import extract

    read = [sum(extract(r.answers[j], r.answer_kind or "text") is not None for r in rows) for j in range(len(rows[0].worker_ids))]
    kinds = "/".join(sorted({r.answer_kind or "text" for r in rows}))
    out.append(f"| final answer read ({kinds}) | {len(rows)} | " + " | ".join(str(n) for n in read) + " |")
    return out


if __name__ == "__main__":
    sys.exit(main())
