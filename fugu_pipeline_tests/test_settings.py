"""Every FUGU_* variable is one field of one typed settings object, read through `settings()`;
a bad value is refused in one line naming the variable; the reference page is the class's table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline.settings import GROUPS, Settings, SettingsError, env_name, markdown_table, settings

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fugu_pipeline"
NAME = re.compile(r"(?<![A-Za-z0-9_])FUGU_[A-Z0-9_]+")
DIRECT_READ = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["']FUGU_""")


def _package_sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_every_fugu_variable_in_the_package_is_a_field_of_the_settings():
    fields = {env_name(f) for f in Settings.model_fields}
    named = {name for text in _package_sources().values() for name in NAME.findall(text)}
    assert named, "the grep found no FUGU_ name at all: the pattern is wrong"
    assert named - fields == set(), f"FUGU_ variables the settings class does not define: {sorted(named - fields)}"


def test_no_module_but_the_settings_reads_a_fugu_variable_itself():
    direct = [f"{p.relative_to(REPO)}:{i}" for p, text in _package_sources().items()
              for i, line in enumerate(text.splitlines(), 1) if DIRECT_READ.search(line)]
    assert direct == []


@pytest.mark.parametrize("name, value, says", [
    ("FUGU_STORE_RETRIES", "many", "valid integer"),
    ("FUGU_STORE_RETRIES", "0", "greater than or equal to 1"),
    ("FUGU_DUCKDB_LOCK_WAIT_S", "-1", "greater than or equal to 0"),
    ("FUGU_BATCH_SENSOR_INTERVAL_S", "10s", "valid integer"),
    ("FUGU_CATALOG_MAX_AGE_H", "soon", "valid number"),
    ("FUGU_EXECUTOR", "spark", "'multiprocess', 'celery' or 'k8s'"),
    ("FUGU_TEST_CRASH_AT", "ledger:x", "pattern"),
    # each of these was accepted, then failed later with a traceback (Dagster's schedule, fsspec, a
    # mkdir under a file) or was read as a local path ("s3://" with no bucket)
    ("FUGU_CATALOG_CRON", "99 * * * *", "not a cron schedule ('99' out of 0-59)"),
    ("FUGU_CATALOG_CRON", "0 0 * *", "not a cron schedule (4 fields)"),
    ("FUGU_DATA_URL", "ftp://host/data", "not an object-store URL"),
    ("FUGU_MODELS_URL", "s3://", "not an object-store URL"),
    ("FUGU_DATA_URL", "/srv/shared/data", "file:///abs/path"),
    ("FUGU_OPENROUTER_BASE_URL", "openrouter.ai/api/v1", "not an http(s) URL"),
    ("FUGU_S3_ENDPOINT_URL", "localhost:9000", "not an http(s) URL"),
    ("FUGU_HOME", __file__, "a file, not a folder"),
])
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as err:
        settings()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name}={value!r}: ") and says in message


@pytest.mark.parametrize("name, value", [
    ("FUGU_CATALOG_CRON", "*/15 0-6 * jan-mar mon-fri"), ("FUGU_CATALOG_CRON", "@daily"),
    ("FUGU_CATALOG_CRON", "0,30 * 1-31/2 * 7"), ("FUGU_DATA_URL", "s3://bucket/data"),
    ("FUGU_MODELS_URL", "file:///srv/shared/models"), ("FUGU_MODELS_URL", "memory://fugu/models"),
    ("FUGU_S3_ENDPOINT_URL", "http://127.0.0.1:9000"), ("FUGU_OPENROUTER_BASE_URL", "https://proxy.example/api/v1"),
])
def test_a_good_value_is_taken_as_given(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert getattr(settings(), name.removeprefix("FUGU_").lower()) == value


def test_every_cron_the_settings_take_is_one_dagster_takes():
    from dagster._utils.schedules import is_valid_cron_string

    from fugu_pipeline.settings import cron_problem

    tokens = ["*", "0", "7", "12", "31", "59", "60", "*/5", "1-5", "5-1", "jan", "Mon", "sun-sat", "0,30", "1-31/2",
              "*/0", "x", "-1", "012", "1-2-3", "8"]
    rng = np.random.default_rng(0)
    taken = 0
    for _ in range(20000):
        expr = " ".join(rng.choice(tokens, 5))
        if cron_problem(expr) is None:
            taken += 1
            assert is_valid_cron_string(expr), expr
    assert taken > 100  # the draw reaches valid schedules, not only refusals


def test_list_models_and_the_catalog_asset_read_the_same_api_root(monkeypatch):
    from fugu_pipeline.defs.catalog import OpenRouterResource
    from fugu_pipeline.workers.catalog import OPENROUTER_BASE_URL, catalog_base_url

    assert catalog_base_url() == OpenRouterResource.from_env().base_url == OPENROUTER_BASE_URL
    monkeypatch.setenv("FUGU_OPENROUTER_BASE_URL", "http://127.0.0.1:9/api/v1")
    assert catalog_base_url() == OpenRouterResource.from_env().base_url == "http://127.0.0.1:9/api/v1"
    assert catalog_base_url("http://other/api") == "http://other/api"  # list-models' --base-url


def test_the_executor_name_is_read_as_the_old_reader_did(monkeypatch):
    monkeypatch.setenv("FUGU_EXECUTOR", " Celery ")
    assert settings().executor == "celery"


def test_settings_follow_the_environment_and_empty_is_unset(monkeypatch):
    monkeypatch.setenv("FUGU_STORE_RETRIES", "3")
    assert settings().store_retries == 3
    monkeypatch.setenv("FUGU_STORE_RETRIES", "7")  # a later change is seen without clearing anything
    assert settings().store_retries == 7
    monkeypatch.setenv("FUGU_STORE_RETRIES", "")
    assert settings().store_retries == Settings.model_fields["store_retries"].default
    assert settings() is settings()  # cached while the FUGU_ values stay the same
    first = settings()
    settings.cache_clear()
    assert settings() is not first and settings() == first


def test_a_key_is_a_secret_never_shown(monkeypatch):
    token = "sk-fugu-serve-token-0123456789"
    monkeypatch.setenv("FUGU_SERVE_TOKEN", token)
    monkeypatch.setenv("FUGU_SIGNING_KEY", token + "-signing")
    now = settings()
    assert now.serve_token.get_secret_value() == token
    for shown in (repr(now), str(now), now.model_dump_json()):
        assert token not in shown


def test_a_bad_value_next_to_a_secret_does_not_print_the_secret(monkeypatch):
    token = "sk-fugu-serve-token-0123456789"
    monkeypatch.setenv("FUGU_SERVE_TOKEN", token)
    monkeypatch.setenv("FUGU_STORE_TIMEOUT_S", "never")
    with pytest.raises(SettingsError) as err:
        settings()
    assert "FUGU_STORE_TIMEOUT_S" in str(err.value) and token not in str(err.value)


@pytest.mark.parametrize("group", GROUPS)
def test_the_reference_page_is_the_settings_table(group):
    page = (REPO / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    block = re.search(rf"<!-- settings: {re.escape(group)} -->\n(.*?)\n<!-- /settings -->", page, re.DOTALL)
    assert block is not None, f"docs/reference/environment.md has no table for {group!r}"
    assert block.group(1) == markdown_table(group), "run scripts/environment_table.py"


def test_every_field_is_in_a_table_with_a_description():
    for name, info in Settings.model_fields.items():
        assert (info.json_schema_extra or {}).get("group") in GROUPS and info.description, name
        assert f"`{env_name(name)}`" in "\n".join(markdown_table(g) for g in GROUPS)


@pytest.mark.slow
def test_the_dagster_definitions_read_their_windows_and_intervals_from_the_settings(tmp_path):
    """Freshness windows, sensor intervals and the catalog schedule are fixed when the definitions
    load: from the same object, so a bad value stops the load in one line naming the variable."""
    code = ("import fugu_pipeline.defs.partitions as p, fugu_pipeline.defs.sensors as s, "
            "fugu_pipeline.defs.automation as a, fugu_pipeline.defs.operations as o\n"
            "print(p.CATALOG_FRESHNESS.fail_window.to_timedelta().total_seconds(), "
            "p.ROUTER_FRESHNESS.fail_window.to_timedelta().total_seconds(), "
            "s.benchgen_batch_sensor.minimum_interval_seconds, a.AUTOMATION_INTERVAL_S, "
            "o.openrouter_catalog_schedule.cron_schedule)")
    env = {**os.environ, "FUGU_CATALOG_MAX_AGE_H": "30", "FUGU_ROUTER_MAX_AGE_D": "9",
           "FUGU_BATCH_SENSOR_INTERVAL_S": "17", "FUGU_AUTOMATION_INTERVAL_S": "4", "FUGU_CATALOG_CRON": "5 * * * *"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split(maxsplit=4) == ["108000.0", "777600.0", "17", "4", "5 * * * *\n"]
    bad = subprocess.run([sys.executable, "-c", code], env={**env, "FUGU_ROUTER_MAX_AGE_D": "a month"},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0
    assert "SettingsError: FUGU_ROUTER_MAX_AGE_D='a month': Input should be a valid number" in bad.stderr.splitlines()[-1]


def test_a_command_refuses_a_bad_value_in_one_line_before_it_starts(monkeypatch, tmp_path, capsys):
    from fugu_pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FUGU_DUCKDB_LOCK_WAIT_S", "soon")
    assert main(["route", "--prompt", "What is 2 + 2?"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fugu-lite route: FUGU_DUCKDB_LOCK_WAIT_S='soon': Input should be a valid number, unable to parse "
                   "string as a number; set it to a valid value or unset it (seconds a reader waits for a `duckdb` shell "
                   "holding the matrix's lock before it reads a snapshot copy)"]
