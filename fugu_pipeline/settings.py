"""Every `FUGU_*` environment variable, in one typed object: `settings()`.

Each variable is a field of `Settings` (typed, with its default and what it does); a value that
does not parse is refused in one line naming the variable (`SettingsError`), the first time any
setting is read. Keys and tokens are `SecretStr`: their value is read with `.get_secret_value()`
where it is used and never appears in a repr, a log or an error. Other variables the project reads
(`OPENROUTER_API_KEY`, a worker's `api_key_env`, `DAGSTER_HOME`, `AWS_ENDPOINT_URL`, ...) are the
standards of other tools and stay where they are read.

`settings()` is cached on the `FUGU_*` part of the environment: setting a variable (a test's
`monkeypatch.setenv`, a `.env` file loaded later) is seen by the next call without any ceremony;
`settings.cache_clear()` drops the cache. The reference table of docs/reference/environment.md is
`markdown_table()` (a test compares the two).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "FUGU_"

# The sections of the reference table, in the order the page shows them.
KEYS, PROJECT, SENSORS, SCALE, SERVE, TESTS = (
    "Keys", "The project", "Sensors, schedules and freshness", "Scaling out", "Serving", "Tests")
GROUPS = (KEYS, PROJECT, SENSORS, SCALE, SERVE, TESTS)


class SettingsError(ValueError):
    """A `FUGU_*` variable holds a value that cannot be used; the message names it and says what it takes."""


def _f(default, group: str, what: str, shown: str | None = None, **limits):
    """A field: its default, its section of the reference table, what it does, and the default as
    the table shows it when the value itself is not what a reader should see (`shown`)."""
    extra = {"group": group, **({"shown": shown} if shown is not None else {})}
    return Field(default, description=what, json_schema_extra=extra, **limits)


class Settings(BaseSettings):
    """The project's settings from the environment (`FUGU_<FIELD NAME>`)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True)

    # -- keys and tokens: never printed
    serve_token: SecretStr | None = _f(None, KEYS, "`fugu-lite serve`: the bearer token clients must send (`--token` "
                                       "overrides; a flag is visible in the process list)")
    app_url: str | None = _f(None, KEYS, "OpenRouter workers: sent as `HTTP-Referer`, so OpenRouter attributes the calls to your app")
    signing_key: SecretStr | None = _f(None, KEYS, "`fugu-lite pack`, `fugu-lite keygen --public`: your private ed25519 "
                                       "signing key for packs (base64 of its 32 raw bytes), as `fugu-lite keygen` prints it; "
                                       "never written by fugu-lite, never in a pack")
    collector_key: SecretStr | None = _f(None, KEYS, "the collector (every cost-ledger line), `fugu-lite collector-key`: the "
                                         "collector's private ed25519 key (base64 of its 32 raw bytes) that signs every "
                                         "ledger line; unset: `FUGU_COLLECTOR_KEY_FILE`")
    collector_key_file: Path | None = _f(None, KEYS, "the file holding the collector key's base64 text, made the first time "
                                         "a line is written", shown="`$XDG_CONFIG_HOME/fugu-lite/collector.key`, else `~/.config/…`")

    # -- the project
    project_dir: Path = _f(Path("."), PROJECT, "where `data/`, `models/`, `configs/` are, for the code location",
                           shown="the current directory")
    workers_config: str = _f("configs/workers.mock.yaml", PROJECT, "the worker YAML of the code location")
    encoder: str = _f("Qwen/Qwen3-0.6B", PROJECT, "the encoder resource and the default of `--encoder` "
                      "(`tiny` keeps everything offline)")
    home: Path | None = _f(None, PROJECT, "where the tiny encoder is built (`encoders/tiny-qwen3`)",
                           shown="`~/.cache/fugu_pipeline`")
    duckdb_lock_wait_s: float = _f(5.0, PROJECT, "seconds a reader waits for a `duckdb` shell holding the matrix's lock "
                                   "before it reads a snapshot copy", ge=0)
    matrix_memory_limit: str = _f("3GB", PROJECT, "DuckDB's memory limit while building the matrix (past it DuckDB spills to "
                                  "disk beside the database); it bounds DuckDB only, the build's last step holds roughly "
                                  "100 bytes a cell more", min_length=1)

    # -- sensors, schedules and freshness (read when the definitions load)
    batch_sensor_interval_s: int = _f(10, SENSORS, "how often `benchgen_batch_sensor` looks at `data/benchgen/`", ge=1)
    automation_interval_s: int = _f(5, SENSORS, "how often `reward_matrix_automation` reads the run records", ge=1)
    catalog_sensor_interval_s: int = _f(3600, SENSORS, "how often `catalog_change_sensor` (off by default) fetches the catalog", ge=1)
    catalog_update_sensor_interval_s: int = _f(60, SENSORS, "how often `catalog_update_sensor` looks for a refreshed catalog", ge=1)
    settings_sensor_interval_s: int = _f(30, SENSORS, "how often `settings_sensor` observes the settings files (trainer "
                                         "YAMLs, the promotion policy, the `reward:` block, the encoder's settings)", ge=1)
    catalog_cron: str = _f("0 * * * *", SENSORS, "the schedule of `openrouter_catalog_schedule` (off by default)")
    catalog_max_age_h: float = _f(26.0, SENSORS, "the catalog's freshness policy fails after this many hours (warns after 2)", gt=2)
    router_max_age_d: float = _f(30.0, SENSORS, "the promoted router's freshness policy fails after this many days (warns after 7)", gt=7)
    openrouter_base_url: str | None = _f(None, SENSORS, "another API root for the catalog (a proxy, a mirror, the loopback stub)",
                                         shown="OpenRouter's API")

    # -- scaling out
    executor: Literal["multiprocess", "celery", "k8s"] = _f("multiprocess", SCALE, "`celery` (steps to Celery workers) or "
                                                            "`k8s` (a Kubernetes job per step)")
    celery_broker: str = _f("redis://127.0.0.1:6379/0", SCALE, "the Celery broker (Redis)")
    celery_backend: str | None = _f(None, SCALE, "the Celery result backend", shown="the broker's URL")
    data_url: str | None = _f(None, SCALE, "the shared `data/` (responses, embeddings) in an object store every machine "
                              "reads (`s3://…`, `gs://…`, `file://…`)", shown="local `data/`")
    models_url: str | None = _f(None, SCALE, "the shared `models/` (checkpoints, the promoted pointer)", shown="local `models/`")
    s3_endpoint_url: str | None = _f(None, SCALE, "an S3-compatible service other than AWS (MinIO, a loopback stub); "
                                     "unset: `AWS_ENDPOINT_URL`, else AWS")
    store_retries: int = _f(5, SCALE, "attempts of a store request, with backoff", ge=1, le=100)
    store_timeout_s: float = _f(30.0, SCALE, "the connect and read deadline of one store request", gt=0)
    store_cache: Path | None = _f(None, SCALE, "this machine's copies of checkpoints read from the store",
                                  shown="`~/.cache/fugu_pipeline/store`")

    # -- serving
    cascade_read_deadline_s: float = _f(0.5, SERVE, "how long `serve` reads a request's cascade replies (final answers, "
                                        "verifier), all steps together, before it goes on without them ([untrusted "
                                        "replies](../routing/cascades.md#untrusted-replies))", gt=0, allow_inf_nan=False)

    # -- tests
    test_crash_at: str | None = _f(None, TESTS, "test-only fault injection, `<point>:<n>`: the process kills itself "
                                   "(SIGKILL) the n-th time it passes `<point>` of collection (`intent`, `ledger`, "
                                   "`record`), for the kill -9 tests of the cost ledger", pattern=r"^[a-z_]+(:[1-9][0-9]*)?$")

    @field_validator("executor", mode="before")
    @classmethod
    def _executor_name(cls, v):
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("data_url", "models_url")
    @classmethod
    def _store_url(cls, v):
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        if not sep or scheme not in STORE_SCHEMES or not rest.strip("/"):
            raise ValueError(f"not an object-store URL: write <scheme>://<bucket>/<folder> with a scheme of "
                             f"{', '.join(STORE_SCHEMES)} (file:///abs/path for a shared folder)")
        return v

    @field_validator("openrouter_base_url", "s3_endpoint_url", "app_url")
    @classmethod
    def _http_url(cls, v):
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        host = rest.split("/", 1)[0]
        if scheme.lower() not in ("http", "https") or not sep or not host or any(c.isspace() for c in v):
            raise ValueError("not an http(s) URL: write http://host[:port]/path or https://...")
        return v

    @field_validator("catalog_cron")
    @classmethod
    def _cron(cls, v):
        problem = cron_problem(v)
        if problem:
            raise ValueError(f"not a cron schedule ({problem}): five fields, minute hour day-of-month month "
                             "day-of-week, e.g. '0 * * * *'")
        return v

    @field_validator("home", "store_cache", "project_dir")
    @classmethod
    def _a_folder(cls, v):
        if v is not None and v.expanduser().exists() and not v.expanduser().is_dir():
            raise ValueError("a file, not a folder: name a folder (it is made when missing)")
        return v

    def cache_home(self) -> Path:
        """FUGU_HOME, else ~/.cache/fugu_pipeline (the user's home as it is now)."""
        return (self.home or Path.home() / ".cache" / "fugu_pipeline").expanduser()

    def store_cache_dir(self) -> Path:
        """FUGU_STORE_CACHE, else the `store` folder of ~/.cache/fugu_pipeline."""
        return (self.store_cache or Path.home() / ".cache" / "fugu_pipeline" / "store").expanduser()

    def crash_at(self) -> tuple[str, int] | None:
        """FUGU_TEST_CRASH_AT as (point, n), None when unset."""
        if not self.test_crash_at:
            return None
        name, _, n = self.test_crash_at.partition(":")
        return name, int(n or 1)


STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory", "file")
# cron fields: (low, high, names); day-of-week 7 is Sunday too
_CRON_FIELDS = ((0, 59, ()), (0, 23, ()), (1, 31, ()),
                (1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
                (0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")))
_CRON_MACROS = ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually")


def cron_problem(expr: str) -> str | None:
    """What is wrong with a five-field cron expression (None when nothing is): each field a comma
    list of `*`, `n`, `a-b`, each optionally `/step`, within the field's range (month and day names
    too), or one of the `@hourly`-style macros. Split and compared, no pattern: linear in its length."""
    text = expr.strip()
    if text.lower() in _CRON_MACROS:
        return None
    fields = text.split()
    if len(fields) != 5:
        return f"{len(fields)} fields"
    for field, (low, high, names) in zip(fields, _CRON_FIELDS):
        for item in field.split(","):
            span, slash, step = item.partition("/")
            if slash and not (step.isascii() and step.isdigit() and int(step) > 0):
                return f"step {step!r} in {field!r}"
            if span == "*":
                continue
            ends = span.split("-")
            if len(ends) > 2:
                return f"{span!r} in {field!r}"
            values = []
            for end in ends:
                word = end.lower()
                if word in names:
                    values.append(names.index(word) + (1 if low == 1 else 0))
                elif end.isascii() and end.isdigit() and len(end) <= 2:
                    values.append(int(end))
                else:
                    return f"{end!r} in {field!r}"
            if any(not low <= x <= high for x in values):
                return f"{span!r} out of {low}-{high}"
            if len(values) == 2 and values[0] > values[1]:
                return f"{span!r} runs backwards"
    return None


def env_name(field: str) -> str:
    """The variable of a field: `store_retries` -> `FUGU_STORE_RETRIES`."""
    return PREFIX + field.upper()


def settings() -> Settings:
    """The settings from the environment now (cached per `FUGU_*` values); SettingsError names a bad one."""
    return _load(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX))))


@functools.lru_cache(maxsize=16)
def _load(snapshot: tuple[tuple[str, str], ...]) -> Settings:
    del snapshot  # the cache key; Settings reads the same environment
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None


settings.cache_clear = _load.cache_clear  # type: ignore[attr-defined]


def _one_line(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    info = Settings.model_fields.get(field)
    name = env_name(field)
    secret = info is not None and "SecretStr" in str(info.annotation)
    value = "" if secret else f"={os.environ.get(name, '')!r}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    what = f" ({info.description})" if info is not None and info.description else ""
    msg = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
    return f"{name}{value}: {msg}{more}; set it to a valid value or unset it{what}"


# --------------------------------------------------------------------------- the reference table

def _shown_default(info) -> str:
    extra = info.json_schema_extra or {}
    if "shown" in extra:
        return extra["shown"]
    if info.default is None:
        return "unset"
    d = info.default
    return f"`{d}`" if isinstance(d, str) else (f"{d:g}" if isinstance(d, float) else str(d))


def markdown_table(group: str) -> str:
    """One section of docs/reference/environment.md: variable, default, what, for each field of `group`."""
    rows = ["| variable | default | what |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        if (info.json_schema_extra or {}).get("group") == group:
            rows.append(f"| `{env_name(name)}` | {_shown_default(info)} | {info.description} |")
    return "\n".join(rows)
