"""The reward-matrix import format: one `RewardRow` a line, validated at the boundary.

Worker ids must follow a strict rule, `IMPORT_WORKER_ID_PATTERN`: the worker YAML's rule
(`WORKER_ID_PATTERN`: a letter or digit, then letters, digits, `_`, `.` or `-`) plus `/` and `:`,
because imported ids are often model names (`mistralai/Mixtral-8x7B-Instruct-v0.1` in RouteLLM's
data, `qwen/qwen3-8b:free` on OpenRouter), up to 128 characters. No quote, whitespace, semicolon,
parenthesis or backslash can pass. Ids become column names of the matrix's `reward_wide` table and
keys everywhere downstream, so a bad one is refused here, naming the file, the line and the rule,
before anything is built from it.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from fugu_pipeline.reward import MAX_AMOUNT
from fugu_pipeline.files import atomic_write
from fugu_pipeline.tasks.final_answer import AnswerKind
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline.tasks.schema import Split
from fugu_pipeline.workers.config import IMPORT_WORKER_ID_PATTERN, MATRIX_FIXED_COLUMNS

_WORKER_ID = re.compile(IMPORT_WORKER_ID_PATTERN)
WORKER_ID_RULE = (f"a worker id must match {IMPORT_WORKER_ID_PATTERN} (a letter or digit, then up to 127 letters, "
                  "digits, '_', '.', '-', '/' or ':'; the worker YAML's rule plus '/' and ':' for model names)")


def check_worker_id(worker_id: object) -> str:
    """`worker_id` if it follows the worker-id rule, else ValueError naming the id and the rule."""
    if not isinstance(worker_id, str) or not _WORKER_ID.fullmatch(worker_id):
        shown = repr(worker_id) if len(repr(worker_id)) <= 80 else repr(worker_id)[:77] + "..."
        raise ValueError(f"invalid worker id {shown}: {WORKER_ID_RULE}")
    return worker_id


WorkerId = Annotated[str, AfterValidator(check_worker_id)]

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))  # zero-width characters str.strip keeps


def is_blank(text: str | None) -> bool:
    """No text a router could read: None, or only whitespace (Unicode's, NBSP included) and
    zero-width characters."""
    return text is None or not text.translate(_INVISIBLE).strip()


def _visible(text: str) -> str:
    if is_blank(text):
        raise ValueError("the prompt is blank (only whitespace or invisible characters): a router reads nothing")
    return text

# The fixed columns of the matrix's `reward_wide` table; the worker ids are its other columns.
WIDE_FIXED = MATRIX_FIXED_COLUMNS


def check_worker_set(worker_ids: list[str]) -> list[str]:
    """`worker_ids` if they can all be columns of `reward_wide` beside each other: DuckDB column
    names ignore case, so ids that differ only in case, or that equal a fixed column, are refused
    (checked at import, so an import that passes also builds)."""
    seen: dict[str, str] = {c: c for c in WIDE_FIXED}
    for w in worker_ids:
        if w.lower() in seen:
            raise ValueError(f"worker id {w!r} clashes with {seen[w.lower()]!r} as a column of the matrix "
                             "(its column names ignore case, and task_id, split and domain are taken); rename one of them")
        seen[w.lower()] = w
    return worker_ids


# The largest magnitude a reward, cost or latency may have, the bound a collected call record has
# too: training squares rewards (1e308 overflowed to non-finite weights, reported without its
# cause), and no real call costs a million dollars.
VALUE_LIMIT = MAX_AMOUNT


class RewardRow(BaseModel):
    """One row of an imported reward matrix."""

    model_config = ConfigDict(extra="ignore")

    task_id: str = Field(min_length=1)
    prompt: Annotated[str, AfterValidator(_visible)] = Field(min_length=1)
    domain: str = "general"
    split: Split = "train"
    worker_ids: list[WorkerId] = Field(min_length=1)
    rewards: list[float] | None = None
    quality: list[float] | None = None
    cost_usd: list[float] | None = None
    latency_s: list[float] | None = None
    tags: list[str] = Field(default_factory=list, description="labels to report on (e.g. 'id'/'ood', 'metric:em')")
    answers: list[str | None] | None = Field(None, description="each worker's reply (or its final answer), parallel to "
                                             "worker_ids; null where unknown. Cascades read them")
    answer_kind: AnswerKind | None = Field(None, description="how a final answer is read from a reply: choice, number, "
                                           "code or text (default: detected from the prompt and replies)")

    @model_validator(mode="after")
    def _shape(self) -> "RewardRow":
        n = len(self.worker_ids)
        if len(set(self.worker_ids)) != n:
            raise ValueError("worker_ids has duplicates")
        _worker_set_ok(tuple(self.worker_ids))  # once per distinct list, not once per row
        if self.rewards is None and self.quality is None:
            raise ValueError("row needs 'rewards' or 'quality'")
        for name in ("rewards", "quality", "cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is not None:
                if len(v) != n:
                    raise ValueError(f"'{name}' has {len(v)} values for {n} worker_ids")
                if any(x != x or x in (float("inf"), float("-inf")) for x in v):
                    raise ValueError(f"'{name}' holds NaN or infinite values")
                if any(abs(x) > VALUE_LIMIT for x in v):
                    raise ValueError(f"'{name}' holds values beyond ±{VALUE_LIMIT:,.0f}; rescale them (a utility is "
                                     "usually within [-1, 1]; squared in training, 1e308 overflows)")
        for name in ("cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is not None and any(x < 0 for x in v):
                raise ValueError(f"'{name}' holds negative values; a call's cost and latency are 0 or more "
                                 "(leave the field out where they are unknown)")
        if self.quality is not None and any(q < 0 or q > 1 for q in self.quality):
            raise ValueError("'quality' values must lie in [0, 1]")
        if self.answers is not None:
            check_answers(self.answers, n)
        return self


PARALLEL_FIELDS = ("rewards", "quality", "cost_usd", "latency_s", "answers")  # one value per worker, as worker_ids


def worker_names(value):
    """The workers an import keeps, as `--workers` and `import_options.workers` give them: a list as
    it is, comma-separated text ("c, a") split into names, "auto" (every worker) as it is."""
    if isinstance(value, str):
        return "auto" if value.strip() == "auto" else [w.strip() for w in value.split(",") if w.strip()]
    return list(value)


def keep_workers(rows: list[RewardRow], names: list[str]) -> list[RewardRow]:
    """`rows` with only the workers `names`, each row's fields cut alike, in the rows' own worker
    order. ValueError naming the problem when a name is not among the rows' workers, or fewer than two
    workers would remain (routing needs two)."""
    have = list(rows[0].worker_ids) if rows else []
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ValueError(f"worker {unknown[0]!r} is not among the file's workers ({', '.join(have)})")
    if len(set(names)) < 2:
        raise ValueError(f"{len(set(names))} worker(s) named; routing needs at least 2 of {', '.join(have)}")
    idx = [j for j, w in enumerate(have) if w in set(names)]

    def cut(values):
        return None if values is None else [values[j] for j in idx]

    return [r.model_copy(update={"worker_ids": cut(r.worker_ids), **{f: cut(getattr(r, f)) for f in PARALLEL_FIELDS}})
            for r in rows]


MAX_ANSWER_CHARS = 1_000_000  # a reply longer than this is a runaway generation, not an answer


def check_answers(answers: list[str | None], n: int) -> None:
    """ValueError naming the field and the worker's position when `answers` cannot be stored and
    compared: another length than worker_ids, text that is not valid Unicode (an unpaired
    surrogate, which JSON can spell as \\ud800 but UTF-8 cannot hold), or a runaway length."""
    if len(answers) != n:
        raise ValueError(f"'answers' has {len(answers)} values for {n} worker_ids: give one reply (or null) per worker, "
                         "in worker_ids order")
    for i, a in enumerate(answers):
        if a is None:
            continue
        try:
            a.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"'answers.{i}' is not valid Unicode text ({exc.reason} at character {exc.start}): "
                             "re-export the reply as UTF-8, or give null") from None
        if len(a) > MAX_ANSWER_CHARS:
            raise ValueError(f"'answers.{i}' holds {len(a):,} characters, more than {MAX_ANSWER_CHARS:,}: cut the "
                             "reply to its final part, or give null")


def read_bytes(path: Path, what: str) -> bytes:
    """The file's bytes, a `.gz` one decompressed; a missing file, or a gzip that is not one, is
    truncated or corrupt, is one `TaskFileError` naming the file (every importer reads through it)."""
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(path, [(0, f"file not found; pass the path of {what}")])
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # not gzip, truncated, or corrupt
            raise TaskFileError(path, [(0, f"not a valid gzip file ({exc}); is it whole? Download it again or pass "
                                           "the plain file")]) from None
    return data


@functools.lru_cache(maxsize=64)
def _worker_set_ok(worker_ids: tuple[str, ...]) -> None:
    check_worker_set(list(worker_ids))


TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".pkl", ".pickle", ".xlsx", ".xls", ".feather", ".arrow")
TABLE_HINT = ("`fugu-lite import table` (one column per worker's score) or `fugu-lite import long` (one row per call) "
              "turns a table into a reward-matrix JSONL")


def read_reward_jsonl(path: Path) -> list[RewardRow]:
    """Parse an imported reward matrix; every problem is named by file and line. A table, a binary
    file or another kind of JSON is refused at once, with the command that imports a table."""
    path = Path(path)
    problems: list[tuple[int, str]] = []
    rows: list[RewardRow] = []
    first: list[str] | None = None
    first_kind, first_has = "", {}
    seen: dict[str, int] = {}
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    if suffix in TABLE_SUFFIXES:
        raise TaskFileError(path, [(0, f"a {suffix} table, not a reward-matrix JSONL (one JSON object a line): {TABLE_HINT}")])
    data = read_bytes(path, "a reward-matrix JSONL")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(path, [(data[:exc.start].count(b"\n") + 1, f"not UTF-8 text ({exc.reason} at byte {exc.start}): "
                                    f"a reward-matrix JSONL is UTF-8 JSON, one object a line; a binary table? {TABLE_HINT}")]) from None
    lines = text.removeprefix("\ufeff").split("\n")  # a BOM some editors write; at \n only: a JSON string may hold U+0085 or U+2028 raw
    lead = next(((n, x) for n, x in enumerate(lines, start=1) if x.strip()), None)
    if lead is not None and not lead[1].lstrip().startswith("{"):
        raise TaskFileError(path, [(lead[0], f"not a JSON object ({lead[1].strip()[:60]!r}): a reward-matrix JSONL holds one "
                                             f"JSON object a line; a CSV or TSV table? {TABLE_HINT}")])
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = RewardRow.model_validate_json(line)
        except ValidationError as exc:
            for e in exc.errors():
                loc = ".".join(str(x) for x in e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                problems.append((lineno, f"field '{loc}': {msg}" if loc else msg))
            continue
        kind = "quality" if row.quality is not None else "rewards"
        has = {f: getattr(row, f) is not None for f in ("cost_usd", "latency_s")}
        if first is None:
            first, first_kind, first_has = row.worker_ids, kind, has
        elif kind != first_kind:
            problems.append((lineno, f"gives {kind} where the first row gives {first_kind}: a matrix's utilities come one way, "
                                     "from quality and the configured weights, or as rewards, in every row"))
            continue
        elif has != first_has:
            f = next(f for f in has if has[f] != first_has[f])
            problems.append((lineno, f"{'gives' if has[f] else 'lacks'} '{f}', which the first row {'lacks' if has[f] else 'gives'}: "
                                     f"give every row its {f} or none (a missing one would count as 0 in the costs and budgets)"))
            continue
        elif row.worker_ids != first:
            problems.append((lineno, f"worker_ids {row.worker_ids} differ from the first row's {first}; every row must list the same workers in the same order"))
            continue
        if row.task_id in seen:
            problems.append((lineno, f"duplicate task_id {row.task_id!r} (first on line {seen[row.task_id]})"))
            continue
        seen[row.task_id] = lineno
        rows.append(row)
    odd = [p for p in problems if "differ from the first row's" in p[1]]
    if len(odd) > len(rows):  # most rows agree with each other, not with the first: the first is the odd one
        first_line = next(n for n, x in enumerate(lines, start=1) if x.strip())
        problems = [p for p in problems if p not in odd] + [(first_line, (
            f"worker_ids {first} differ from those of {len(odd)} later rows (e.g. line {odd[0][0]}); every row must list "
            "the same workers in the same order"))]
    if problems and not rows and lead is not None and _is_task_row(lead[1]):
        raise TaskFileError(path, [(0, (
            "a BenchGen task file (its rows have a grader or reference_answer and no worker_ids), not a reward matrix: "
            "put it in data/benchgen/ for the pipeline to collect each worker's answers, or import routing data "
            "that scores each worker on each prompt"))])
    if problems:
        raise TaskFileError(path, problems)
    if not rows:
        raise TaskFileError(path, [(0, "the file holds no rows")])
    return rows


def _is_task_row(line: str) -> bool:
    """The first line of a BenchGen batch (a task with its grader), not a matrix row."""
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "worker_ids" not in obj and ("grader" in obj or "reference_answer" in obj)


def write_reward_jsonl(rows: list[RewardRow], out_path) -> Path:
    """Write rows atomically (temp file + os.replace), one JSON object a line."""
    out_path = Path(out_path)
    if not rows:
        raise ValueError(f"{out_path}: no rows to write")
    workers = rows[0].worker_ids
    seen: set[str] = set()
    for r in rows:
        if r.worker_ids != workers:
            raise ValueError(f"{out_path}: row {r.task_id!r} has worker_ids {r.worker_ids}, not {workers}; every row must list the same workers in the same order")
        if r.task_id in seen:
            raise ValueError(f"{out_path}: duplicate task_id {r.task_id!r}")
        seen.add(r.task_id)
    data = "".join(json.dumps(_row_json(r), ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    if out_path.name.endswith(".gz"):  # read back by read_reward_jsonl as it is named
        data = gzip.compress(data, mtime=0)
    return atomic_write(out_path, data)


def _row_json(r: RewardRow) -> dict:
    """A row as written: no null fields, and no `tags` key when it has none."""
    d = r.model_dump(exclude_none=True)
    if not d.get("tags"):
        d.pop("tags", None)
    return d
