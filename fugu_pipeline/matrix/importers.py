"""Importers of public routing data into the reward-matrix import format.

Sources (the formats of the upstream releases named below):

- RouteLLM evals (lm-sys/RouteLLM `routellm/evals`): one CSV per benchmark (`gsm8k_responses.csv.gz`,
  `mmlu_responses/mmlu_<subject>.csv.gz`). Column `prompt`, then one column per model holding
  `True`/`False` correctness, optionally `<model>_response` columns with the reply (kept as `answers`).
  `<bench>_contaminated_prompts.jsonl` lists prompts to remove: each line has `eval_prompt`, which
  must equal the CSV `prompt` exactly (the rule RouteLLM's own benchmarks apply).
- RouteLLM MT-Bench: `mt_bench_judgements.jsonl.gz`, one GPT-4 judgement (`score` 1-10) per
  (`question_id`, `model`, `turn`); `mt_bench_question.jsonl` gives each question's `category` and
  `turns`. Read with the long-table importer (`import_long.py`).
- LLMRouter dcrouter (ulab-uiuc/LLMRouter `data/dcrouter_preprocessed`): a JSON array of
  `{"question": str, "scores": {model: score in [0, 1]}, "cluster_id": int (train only)}`.
  `default_llm.json` maps the same model names to `input_price`/`output_price` in USD per million
  tokens. `default_query_{train,test}.jsonl(.gz)` give each query's `task_name` (used as domain).

Tags (reported on per tag, next to per domain, by `summarize` and by every evaluation report):
every imported row is tagged `id` when its domain occurs among the training rows, else `ood` (a
domain the router never trained on); dcrouter rows also carry `metric:<upstream metric>` (e.g.
`metric:em_mc`, `metric:code_eval`); RouteLLM rows carry `source:<benchmark>`. A jsonl file keeps
the tags its rows hold.

Conventions shared by every importer:
- `worker_ids` are the model names sorted alphabetically, identical in every row.
- task ids are `<source>-<row index in the upstream file, 0-based>`, stable under contamination removal.
- a split drawn here is a pure function of (seed, task_id): `unit(seed, task_id) < test_fraction`
  → test, `< test_fraction + val_fraction` → val, else train.

No dagster here: plain Python, polars and json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import polars as pl

from fugu_pipeline.matrix.import_common import assign_split, check_workers, fail, read_bytes, read_text, tag_in_distribution
from fugu_pipeline.matrix.import_format import (  # noqa: F401 (this module's API too)
    RewardRow,
    keep_workers,
    read_reward_jsonl,
    worker_names,
    write_reward_jsonl,
)
from fugu_pipeline.matrix.import_summary import summarize
from fugu_pipeline.tasks.loading import TaskFileError

KINDS = ("routellm-gsm8k", "routellm-mmlu", "routellm-mtbench", "routellm-csv", "dcrouter", "jsonl", "table", "long")

# dcrouter has no token counts; the prompt's token count is estimated as ceil(chars / 4).
PROMPT_CHARS_PER_TOKEN = 4
COST_BASIS_ESTIMATE = (
    "estimate: (ceil(len(prompt)/4) * input_price + assumed_output_tokens * output_price) / 1e6, "
    "prices in USD per million tokens from default_llm.json; the data has no token counts"
)

_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


# --------------------------------------------------------------------------- helpers


def _source_name(path: Path) -> str:
    """`gsm8k_responses.csv.gz` → `gsm8k`; `mmlu_anatomy.csv.gz` → `mmlu_anatomy`."""
    name = Path(path).name
    for suffix in (".gz", ".csv", ".json", ".jsonl"):
        name = name.removesuffix(suffix)
    return name.removesuffix("_responses")


# --------------------------------------------------------------------------- RouteLLM


def read_contaminated(path: Path) -> set[str]:
    """The `eval_prompt` of every line of a RouteLLM `*_contaminated_prompts.jsonl`."""
    out: set[str] = set()
    problems: list[tuple[int, str]] = []
    for lineno, line in enumerate(read_text(path, "a RouteLLM *_contaminated_prompts.jsonl").split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append((lineno, f"malformed JSON: {exc.msg}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("eval_prompt"), str):
            problems.append((lineno, "expected an object with a string 'eval_prompt'"))
            continue
        out.add(obj["eval_prompt"])
    if problems:
        raise TaskFileError(Path(path), problems)
    return out


def _routellm_matrix(csv_path: Path, contaminated: set[str]) -> tuple[list[str], list[tuple[int, str, list[float], list | None]], int]:
    """(sorted model names, [(row index, prompt, correctness, replies or None)], rows removed as contaminated)."""
    csv_path = Path(csv_path)
    raw = read_bytes(csv_path, "a RouteLLM eval CSV (prompt column plus one True/False column per model)")
    try:
        df = pl.read_csv(raw, infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        raise fail(csv_path, f"not a readable CSV: {exc}") from None
    if "prompt" not in df.columns:
        raise fail(csv_path, f"no 'prompt' column (columns: {df.columns}); a RouteLLM eval CSV has 'prompt' then one True/False column per model")
    models = sorted(c for c in df.columns if c != "prompt" and not c.endswith("_response"))
    if len(models) < 2:
        raise fail(csv_path, f"{len(models)} model column(s) besides 'prompt' and '*_response' (columns: {df.columns}); "
                             "routing needs at least 2")
    check_workers(csv_path, models, "model column")
    if df.height == 0:
        raise fail(csv_path, "the CSV has a header but no rows")
    problems: list[tuple[int, str]] = []
    values: dict[str, list[float]] = {}
    for m in models:
        col = []
        for i, v in enumerate(df[m].to_list()):
            s = (v or "").strip().lower()
            if s in _TRUE:
                col.append(1.0)
            elif s in _FALSE:
                col.append(0.0)
            else:
                col.append(math.nan)
                problems.append((0, f"data row {i + 1}: model column {m!r} holds {v!r}, expected True or False"))
        values[m] = col
    prompts = df["prompt"].to_list()
    problems += [(0, f"data row {i + 1}: empty prompt") for i, p in enumerate(prompts) if not (p or "").strip()]
    if problems:
        raise TaskFileError(csv_path, problems)
    replies = [df[f"{m}_response"].to_list() if f"{m}_response" in df.columns else [None] * df.height for m in models]
    has = any(f"{m}_response" in df.columns for m in models)
    kept = [(i, p, [values[m][i] for m in models], [r[i] for r in replies] if has else None)
            for i, p in enumerate(prompts) if p not in contaminated]
    return models, kept, len(prompts) - len(kept)


def _routellm_rows(csv_path, contaminated_path=None, *, test_fraction=0.3, val_fraction=0.1, seed=0, domain=None, prefix=None,
                   answer_kind=None):
    contaminated = read_contaminated(Path(contaminated_path)) if contaminated_path else set()
    models, kept, removed = _routellm_matrix(Path(csv_path), contaminated)
    prefix = prefix or _source_name(Path(csv_path))
    rows = []
    for i, prompt, q, replies in kept:
        tid = f"{prefix}-{i:05d}"
        # split by prompt text: a prompt that occurs twice (MMLU has ~100) never straddles splits
        rows.append(RewardRow(task_id=tid, prompt=prompt, domain=domain or prefix, worker_ids=models, quality=q,
                              split=assign_split(prompt, seed, test_fraction, val_fraction),
                              tags=[f"source:{prefix.split('_')[0]}"], answers=replies,
                              answer_kind=answer_kind if replies is not None else None))
    return rows, removed


def import_routellm(csv_path, contaminated_path=None, *, test_fraction: float = 0.3, val_fraction: float = 0.1,
                    seed: int = 0, domain: str | None = None) -> list[RewardRow]:
    """One RouteLLM eval CSV → rows with quality = correctness (0/1), contaminated prompts removed.
    Task ids `<source>-<row>` (source from the file name, e.g. `gsm8k`); domain defaults to source."""
    return tag_in_distribution(_routellm_rows(csv_path, contaminated_path, test_fraction=test_fraction,
                                              val_fraction=val_fraction, seed=seed, domain=domain)[0])


def _mmlu_rows(folder, contaminated_path=None, **split_opts):
    folder = Path(folder)
    files = sorted(folder.glob("mmlu_*.csv.gz")) or sorted(folder.glob("mmlu_*.csv"))
    if not files:
        raise fail(folder, "no mmlu_*.csv(.gz) files here; pass the folder of RouteLLM mmlu_<subject>.csv.gz files (routellm_evals/mmlu_responses)")
    rows: list[RewardRow] = []
    removed, first = 0, files[0]
    for f in files:
        source = _source_name(f)
        part, n = _routellm_rows(f, contaminated_path, domain=source.removeprefix("mmlu_"), prefix=source, **split_opts)
        if rows and part and part[0].worker_ids != rows[0].worker_ids:
            raise fail(f, f"models {part[0].worker_ids} differ from {rows[0].worker_ids} in {first.name}; every subject file must hold the same models")
        first = first if rows else f
        rows += part
        removed += n
    return rows, removed


def _mtbench_rows(folder, contaminated_path=None, *, test_fraction=0.3, val_fraction=0.1, seed=0):
    """RouteLLM's MT-Bench: one GPT-4 judgement (1-10) per (question, model, turn) in
    `mt_bench_judgements.jsonl(.gz)`, the questions with their turns and category in
    `mt_bench_question.jsonl`. Read by the long-table importer: quality = the mean of both turns'
    scores mapped onto [0, 1], the prompt = the opening turn, domain = category. Contaminated
    questions (their opening turn is an `eval_prompt`) are removed; the split is drawn from the
    prompt, as for the other RouteLLM sets. Task ids `mt_bench-<question_id>`."""
    from fugu_pipeline.matrix.import_long import LongSpec, import_long

    folder = Path(folder)
    spec = LongSpec(worker_column="model", score_column="score", id_column="question_id", prompt_column="turns",
                    domain_column="category", prompts=_first(folder, "mt_bench_question.jsonl", "mt_bench_question.jsonl.gz"),
                    score_range=(1, 10), duplicates="mean")
    rows, _ = import_long(_first(folder, "mt_bench_judgements.jsonl.gz", "mt_bench_judgements.jsonl"), spec)
    contaminated = read_contaminated(Path(contaminated_path)) if contaminated_path else set()
    kept = [r.model_copy(update={"task_id": f"mt_bench-{r.task_id}", "split": assign_split(r.prompt, seed, test_fraction, val_fraction),
                                 "tags": ["source:mt_bench"]}) for r in rows if r.prompt not in contaminated]
    return kept, len(rows) - len(kept)


def import_routellm_mmlu(folder, contaminated_path=None, *, test_fraction: float = 0.3, val_fraction: float = 0.1,
                         seed: int = 0) -> list[RewardRow]:
    """All `mmlu_<subject>.csv(.gz)` of a folder: domain = subject, task ids `mmlu_<subject>-<row>`."""
    return tag_in_distribution(_mmlu_rows(folder, contaminated_path, test_fraction=test_fraction,
                                          val_fraction=val_fraction, seed=seed)[0])


# --------------------------------------------------------------------------- LLMRouter dcrouter


def _read_dcrouter(path: Path) -> list[dict]:
    path = Path(path)
    try:
        data = json.loads(read_text(path, "an LLMRouter dcrouter_{train,test}.json(.gz)"))
    except json.JSONDecodeError as exc:
        raise fail(path, f"malformed JSON: {exc.msg} at line {exc.lineno}", exc.lineno) from None
    if not isinstance(data, list) or not data:
        raise fail(path, "expected a non-empty JSON array of {'question': ..., 'scores': {model: score}}")
    problems: list[tuple[int, str]] = []
    models = None
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not rec["question"].strip():
            problems.append((0, f"record {i}: needs a non-empty string 'question'"))
            continue
        scores = rec.get("scores")
        if not isinstance(scores, dict) or not scores:
            problems.append((0, f"record {i}: needs 'scores', an object of model → score"))
            continue
        bad = {m: s for m, s in scores.items() if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1}
        if bad:
            problems.append((0, f"record {i}: scores must be numbers in [0, 1]: {bad}"))
        if models is None:
            models = set(scores)
        elif set(scores) != models:
            problems.append((0, f"record {i}: models {sorted(scores)} differ from record 0's {sorted(models)}"))
    if problems:
        raise TaskFileError(path, problems)
    return data


def read_llm_prices(path: Path) -> dict[str, tuple[float, float]]:
    """default_llm.json → {model: (input $/M tokens, output $/M tokens)}."""
    path = Path(path)
    try:
        info = json.loads(read_text(path, "LLMRouter's default_llm.json"))
    except json.JSONDecodeError as exc:
        raise fail(path, f"malformed JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(info, dict):
        raise fail(path, "expected an object of model → {'input_price': ..., 'output_price': ...}")
    out, problems = {}, []
    for name, v in info.items():
        try:
            out[name] = (float(v["input_price"]), float(v["output_price"]))
        except (TypeError, KeyError, ValueError):
            problems.append((0, f"model {name!r}: needs numeric 'input_price' and 'output_price' (USD per million tokens)"))
            continue
        if not all(math.isfinite(x) and x >= 0 for x in out[name]):
            problems.append((0, f"model {name!r}: prices {list(out[name])} must be finite and not negative (USD per million tokens)"))
    if problems:
        raise TaskFileError(path, problems)
    return out


def read_query_info(paths) -> dict[str, tuple[str, tuple[str, ...]]]:
    """LLMRouter default_query_*.jsonl(.gz) → {query text: (task_name, metrics)}; a query listed
    under several task names maps to those names sorted and joined by '+'."""
    names: dict[str, set[str]] = {}
    metrics: dict[str, set[str]] = {}
    for path in paths:
        for lineno, line in enumerate(read_text(Path(path), "an LLMRouter default_query_*.jsonl(.gz)").split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                names.setdefault(obj["query"], set()).add(str(obj["task_name"]))
                if obj.get("metric"):
                    metrics.setdefault(obj["query"], set()).add(str(obj["metric"]))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise fail(Path(path), "expected a JSON object with 'query' and 'task_name'", lineno) from None
    return {q: ("+".join(sorted(s)), tuple(sorted(metrics.get(q, ())))) for q, s in names.items()}


def read_query_tasks(paths) -> dict[str, str]:
    """LLMRouter default_query_*.jsonl(.gz) → {query text: task_name} (see `read_query_info`)."""
    return {q: name for q, (name, _) in read_query_info(paths).items()}


def import_dcrouter(train_path, test_path, llm_info_path=None, *, query_paths=(), val_fraction: float = 0.1,
                    seed: int = 0, assumed_output_tokens: int = 0, drop_test_overlap: bool = True) -> list[RewardRow]:
    """dcrouter train/test JSON → rows with quality = the per-model score.

    Upstream, 119 test prompts (gpqa, human_eval, some mbpp) also appear in the train file; with
    `drop_test_overlap` (default) those train rows are dropped so the held-out score is clean.

    split: test file → test; train file → train, or val for a deterministic `val_fraction` share.
    domain: the query's `task_name` from `query_paths` (default_query_*.jsonl); "general" without them.
    cost_usd (only with `llm_info_path`): see COST_BASIS_ESTIMATE; a model without a price is an error.
    """
    train_path, test_path = Path(train_path), Path(test_path)
    train, test = _read_dcrouter(train_path), _read_dcrouter(test_path)
    models = sorted(train[0]["scores"])
    check_workers(train_path, models, "model")
    if set(test[0]["scores"]) != set(models):
        raise fail(test_path, f"models {sorted(test[0]['scores'])} differ from {models} in {train_path.name}; "
                               "train and test must score the same models")
    prices = None
    if llm_info_path is not None:
        all_prices = read_llm_prices(Path(llm_info_path))
        missing = [m for m in models if m not in all_prices]
        if missing:
            raise fail(Path(llm_info_path), f"no price for models {missing}; add them, or import without llm_info_path (no costs)")
        prices = [all_prices[m] for m in models]
    info = read_query_info(query_paths) if query_paths else {}
    test_prompts = {rec["question"] for rec in test}
    rows = []
    for part, records in (("train", train), ("test", test)):
        for i, rec in enumerate(records):
            if part == "train" and drop_test_overlap and rec["question"] in test_prompts:
                continue
            tid = f"dcrouter-{part}-{i:05d}"
            split = part if part == "test" else assign_split(tid, seed, 0.0, val_fraction)
            q = rec["question"]
            cost = None
            if prices is not None:
                tokens = math.ceil(len(q) / PROMPT_CHARS_PER_TOKEN)
                cost = [(tokens * pin + assumed_output_tokens * pout) / 1e6 for pin, pout in prices]
            domain, metrics = info.get(q, ("general", ()))
            rows.append(RewardRow(task_id=tid, prompt=q, domain=domain, split=split, tags=[f"metric:{m}" for m in metrics],
                                  worker_ids=models, quality=[float(rec["scores"][m]) for m in models], cost_usd=cost))
    return tag_in_distribution(rows)


# --------------------------------------------------------------------------- generic JSONL and writing


def import_generic_jsonl(path, *, seed: int | None = None, test_fraction: float | None = None,
                         val_fraction: float | None = None, workers: list[str] | str | None = None,
                         notes: dict | None = None) -> list[RewardRow]:
    """A reward-matrix JSONL, validated line by line. A row that names its `split`
    keeps it. With `test_fraction` or `val_fraction`, a row without a `split` field gets one drawn
    from (seed, task id) like the other importers' (defaults 0.3 and 0.1, seed 0); without them it
    is train. `workers` (a list, or comma-separated names; None or "auto": all) keeps only those
    workers of every row.
    `notes` (when given) receives how many rows got a drawn split and the workers left out."""
    path = Path(path)
    if not path.is_file():
        raise fail(path, "file not found; pass a reward-matrix JSONL")
    rows = read_reward_jsonl(path)
    names = "auto" if workers is None else worker_names(workers)
    if names != "auto" and rows:
        try:
            kept = keep_workers(rows, names)
        except ValueError as exc:
            raise fail(path, f"{exc} (--workers, or import_options.workers)") from None
        if notes is not None:
            notes["workers_left_out"] = [w for w in rows[0].worker_ids if w not in kept[0].worker_ids]
        rows = kept
    if test_fraction is None and val_fraction is None:
        return rows
    tf = 0.3 if test_fraction is None else test_fraction
    vf = 0.1 if val_fraction is None else val_fraction
    assign_split("", 0, tf, vf)  # the fractions are checked before any row
    out, drawn = [], 0
    for r in rows:
        if "split" in r.model_fields_set:
            out.append(r)
        else:
            out.append(r.model_copy(update={"split": assign_split(r.task_id, seed or 0, tf, vf)}))
            drawn += 1
    if notes is not None:
        notes["splits_drawn"] = (f"{drawn} of {len(rows)} rows had no 'split' field and got one drawn (seed {seed or 0}, "
                                 f"test {tf}, val {vf}); {len(rows) - drawn} kept the split they name")
    return out


# --------------------------------------------------------------------------- summary and dispatcher


def _first(folder: Path, *names: str) -> Path:
    for n in names:
        if (folder / n).exists():
            return folder / n
    return folder / names[0]


def path_options() -> set[str]:
    """The importers' options that name a file: a caller resolves them (the asset: from the project)."""
    from fugu_pipeline.matrix.import_long import LongSpec
    from fugu_pipeline.matrix.import_table import TableSpec

    specs = {n for cls in (TableSpec, LongSpec) for n, f in cls.model_fields.items() if "Path" in str(f.annotation)}
    return specs | {"contaminated_path", "llm_info_path", "train_path", "test_path"}


def check_output(out_path: Path, path: Path, opts: dict) -> None:
    """`out_path` may be written: not a folder, and not one of the files the import reads."""
    out_path = Path(out_path)
    if out_path.is_dir():
        raise fail(out_path, "--output is a folder; give the path of the JSONL file to write, e.g. data/imports/r.jsonl")
    inputs = [Path(path)] + [Path(v) for k, v in opts.items() if k in path_options() and isinstance(v, (str, Path))]
    clash = next((p for p in inputs if p.exists() and p.resolve() == out_path.resolve()), None)
    if clash is not None:
        raise fail(out_path, f"--output is {clash}, a file this import reads: writing it would destroy the data; "
                             "give another path")


def import_source(kind: str, path, out_path, **opts) -> dict:
    """Import `path` as `kind` (`read_source`), write the JSONL to `out_path`, return a summary."""
    check_output(out_path, path, opts)
    rows, notes = read_source(kind, path, **opts)
    write_reward_jsonl(rows, out_path)
    return {"kind": kind, "source": str(path), "out": str(out_path), **notes, **summarize(rows)}


def read_source(kind: str, path, **opts) -> tuple[list[RewardRow], dict]:
    """The reward-matrix rows of `path` read as `kind`, and notes on what was read. `opts` go to the
    importer (seed, val_fraction, test_fraction, domain, contaminated_path, llm_info_path, the
    column options of table and long, ...).

    routellm-gsm8k: path = RouteLLM evals folder (gsm8k_responses.csv.gz, gsm8k_contaminated_prompts.jsonl)
    routellm-mmlu:  path = that folder (mmlu_responses/, mmlu_contaminated_prompts.jsonl)
    routellm-mtbench: path = that folder (mt_bench_judgements.jsonl.gz, mt_bench_question.jsonl,
                    mt_bench_contaminated_prompts.jsonl); GPT-4's 1-10 judgements, both turns averaged
    routellm-csv:   path = one eval CSV; pass contaminated_path to remove contaminated prompts
    dcrouter:       path = folder with dcrouter_{train,test}.json(.gz), default_llm.json, default_query_*.jsonl(.gz)
    table:          path = a CSV/TSV/Parquet/JSONL table, one column per worker's score (matrix/import_table.py)
    long:           path = a CSV/TSV/Parquet/JSONL table, one row per (prompt, worker) (matrix/import_long.py)
    jsonl:          path = a reward-matrix JSONL (validated line by line); rows without a `split` field get
                    one drawn when test_fraction or val_fraction is given, else they are train
    """
    path = Path(path)
    notes: dict = {}
    if kind == "routellm-gsm8k":
        opts.setdefault("contaminated_path", path / "gsm8k_contaminated_prompts.jsonl")
        rows, notes["contaminated_removed"] = _routellm_rows(_first(path, "gsm8k_responses.csv.gz", "gsm8k_responses.csv"),
                                                             answer_kind="number", **opts)
        rows = tag_in_distribution(rows)
    elif kind == "routellm-mmlu":
        opts.setdefault("contaminated_path", path / "mmlu_contaminated_prompts.jsonl")
        rows, notes["contaminated_removed"] = _mmlu_rows(path / "mmlu_responses", **opts)
        rows = tag_in_distribution(rows)
    elif kind == "routellm-mtbench":
        opts.setdefault("contaminated_path", path / "mt_bench_contaminated_prompts.jsonl")
        rows, notes["contaminated_removed"] = _mtbench_rows(path, **opts)
        rows = tag_in_distribution(rows)
    elif kind == "routellm-csv":
        rows, notes["contaminated_removed"] = _routellm_rows(path, **opts)
        rows = tag_in_distribution(rows)
    elif kind == "dcrouter":
        opts.setdefault("train_path", _first(path, "dcrouter_train.json.gz", "dcrouter_train.json"))
        opts.setdefault("test_path", _first(path, "dcrouter_test.json.gz", "dcrouter_test.json"))
        opts.setdefault("llm_info_path", path / "default_llm.json" if (path / "default_llm.json").exists() else None)
        opts.setdefault("query_paths", sorted(path.glob("default_query_*.jsonl*")))
        rows = import_dcrouter(opts.pop("train_path"), opts.pop("test_path"), **opts)
        notes["cost_basis"] = COST_BASIS_ESTIMATE if rows[0].cost_usd is not None else "none: no llm_info_path"
    elif kind == "jsonl":
        unknown = sorted(set(opts) - {"seed", "test_fraction", "val_fraction", "workers"})
        if unknown:
            raise ValueError(f"import kind 'jsonl' takes only seed, test_fraction, val_fraction and workers, got {unknown}")
        rows = import_generic_jsonl(path, **opts, notes=notes)
    elif kind == "table":
        from fugu_pipeline.matrix.import_table import TableSpec, import_table

        rows, table_notes = import_table(path, TableSpec(**opts))
        notes.update(table_notes)
    elif kind == "long":
        from fugu_pipeline.matrix.import_long import LongSpec, import_long

        rows, table_notes = import_long(path, LongSpec(**opts))
        notes.update(table_notes)
    else:
        raise ValueError(f"unknown import kind {kind!r}; use one of {', '.join(KINDS)}")
    return rows, notes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fugu_pipeline.matrix.importers", description="Import routing data as a reward-matrix JSONL.")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("path")
    p.add_argument("out")
    p.add_argument("--seed", type=int)
    p.add_argument("--val-fraction", type=float)
    a = p.parse_args(argv)
    opts = {k: v for k, v in (("seed", a.seed), ("val_fraction", a.val_fraction)) if v is not None}
    print(json.dumps(import_source(a.kind, a.path, a.out, **opts), indent=2))


if __name__ == "__main__":
    main()
