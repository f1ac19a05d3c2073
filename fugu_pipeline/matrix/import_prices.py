"""Per-call cost from token counts and a price list, for routing data that records tokens but not
dollars (SPROUT keeps `num_input_tokens` and `num_output_tokens` per model and call).

The price list is a YAML (or JSON) mapping of worker id to USD per million tokens:

    openai-gpt-4o: {input: 2.50, output: 10.00}
    openai-gpt-4o-mini: {input: 0.15, output: 0.60}

Every worker of the table needs a price; a price is never negative; the file, the worker and the
field are named when one is wrong.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from fugu_pipeline.matrix.import_common import fail, rows_named


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, allow_inf_nan=False, description="USD per million input tokens")
    output: float = Field(ge=0, allow_inf_nan=False, description="USD per million output tokens")


class PriceList(RootModel[dict[str, Price]]):
    pass


def load_prices(path: Path, workers: list[str]) -> dict[str, Price]:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise fail(path, "price list not found; pass a YAML of worker: {input: USD per M tokens, output: ...}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise fail(path, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        prices = PriceList.model_validate(raw).root
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"]) or "the top level"
        raise fail(path, f"{where}: {e['msg']} (each worker: {{input: USD per M tokens, output: USD per M tokens}})") from None
    missing = [w for w in workers if w not in prices]
    if missing:
        raise fail(path, f"no price for worker(s) {missing[:5]}; every worker of the table needs one")
    return prices


def token_costs(df: pl.DataFrame, workers: list[str], prices: dict[str, Price], fields: tuple[str, str], path: Path,
                line: pl.Series) -> pl.DataFrame:
    """USD per call for each worker: its record's input and output token counts at its price."""
    out = {}
    for w in workers:
        s = df[w]
        have = {f.name for f in s.dtype.fields} if isinstance(s.dtype, pl.Struct) else set()
        gone = [f for f in fields if f not in have]
        if gone:
            raise fail(path, f"column {w!r}: a price list needs token counts, and its records have no {gone[0]!r} field"
                             f"{f' (fields: {sorted(have)[:12]})' if have else ''}; name them with --input-tokens-field "
                             "and --output-tokens-field, or give costs with --cost-column")
        n_in, n_out = (s.struct.field(f).cast(pl.Float64, strict=False) for f in fields)
        bad = n_in.is_null() | n_out.is_null() | (n_in < 0) | (n_out < 0) | n_in.is_nan() | n_out.is_nan() | n_in.is_infinite() | n_out.is_infinite()
        if bad.any():
            raise fail(path, f"column {w!r}: missing, negative or infinite token counts in rows {rows_named(line, bad)}")
        out[w] = (n_in * prices[w].input + n_out * prices[w].output) / 1e6
    return pl.DataFrame(out)
