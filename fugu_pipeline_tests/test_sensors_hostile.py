"""The sensors under hostile or odd conditions, the way a deployment meets them: evaluated through
`evaluate_tick` with the definitions' own resources on a real instance (the daemon's path).

A sensor that raises is refused by the daemon on every tick, so every bad input must end as one
line naming what is wrong, while the good inputs beside it go on. Loopback only."""

from __future__ import annotations

import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline_tests.conftest import task_row, write_jsonl
from fugu_pipeline_tests.daemon_path import launch, materialize, tick

BATCH = "benchgen_batch_sensor"


@pytest.fixture
def project(project):
    """The shipped project with its sample batch cut to 30 tasks (10 per domain): every test here
    is about what the sensors request and skip, which 30 tasks show as well as 300 at a tenth of the
    collection runs' cost."""
    sample = project / "data" / "benchgen" / "sample.jsonl"
    sample.write_text("".join(sample.read_text().splitlines(keepends=True)[:30]))
    return project


def _keys(result) -> set[str]:
    return {r.run_key for r in result.run_requests}


def one_worker(project) -> str:
    """A worker config with one mock worker (configs/one.yaml), for the tests that launch collection
    runs but check the batch sensor's keys and cursors: one worker's runs show them as well as three
    workers' runs, at half the runs."""
    (project / "configs" / "one.yaml").write_text(json.dumps({"workers": [{"id": "a", "kind": "mock"}]}))
    return "configs/one.yaml"


# --------------------------------------------------------------------------- the batch sensor's cursor


CORRUPT_BATCH_CURSORS = ["not json {", "[1, 2]", "null", '"a string"', '{"batches": [1], "refused": 3}',
                         '{"batches": {"sample": 7, "x": null}}']


@pytest.mark.slow
def test_a_corrupt_batch_cursor_is_named_and_relaunches_nothing(project, capfd):
    """Each corrupt cursor, before and after the first collection, on one instance: evaluating a
    tick changes nothing the next one reads (the partitions it adds are there already), so the
    cursors share the one collection instead of each launching its own."""
    defs = build_defs(str(project), one_worker(project))
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, BATCH)
        assert first.run_requests
        assert "unreadable" not in capfd.readouterr().err
        for cursor in CORRUPT_BATCH_CURSORS:
            # not launched yet: a fresh start re-requests the same runs under the same run keys (the daemon drops them)
            again = tick(defs, instance, BATCH, cursor)
            assert _keys(again) == _keys(first), cursor
            err = capfd.readouterr().err
            assert sum("cursor" in line and "unreadable" in line for line in err.splitlines()) == 1, (cursor, err[-2000:])
        launch(defs, instance, first.run_requests)
        for cursor in CORRUPT_BATCH_CURSORS:
            done = tick(defs, instance, BATCH, cursor)  # everything materialized from these very files: nothing
            assert not done.run_requests, cursor
            assert json.loads(done.cursor)["batches"] == json.loads(first.cursor)["batches"], cursor


# --------------------------------------------------------------------------- odd batch files


def test_odd_batch_files_are_each_named_once_and_the_good_ones_go_on(project, capfd):
    bench = project / "data" / "benchgen"
    write_jsonl(bench / "good2.jsonl", [task_row(100)])
    (bench / "empty.jsonl").write_bytes(b"")  # valid name: requested; its load_batch says "no tasks"
    (bench / "latin1.jsonl").write_bytes(b'{"task_id": "caf\xe9"}\n')  # likewise: load_batch says "not UTF-8"
    (bench / "partial.jsonl").write_text(json.dumps(task_row(200)) + "\n" + '{"task_id": "t2')  # being written
    (bench / "huge.jsonl").write_text(json.dumps(task_row(300, prompt="x" * 3_000_000)) + "\n")
    odd = {
        "zero.jsonl": lambda p: p.symlink_to("/dev/zero"),  # read to the end, this never stops
        "fifo.jsonl": lambda p: os.mkfifo(p),  # opened, this blocks the tick for good
        "dir.jsonl": lambda p: p.mkdir(),
        "dangling.jsonl": lambda p: p.symlink_to(bench / "nowhere"),
        "with space.jsonl": lambda p: write_jsonl(p, [task_row(400)]),
        "ünïcode.jsonl": lambda p: write_jsonl(p, [task_row(401)]),
        ".hidden.jsonl": lambda p: write_jsonl(p, [task_row(402)]),
        ("x" * 200) + ".jsonl": lambda p: write_jsonl(p, [task_row(403)]),
    }
    for name, make in odd.items():
        make(bench / name)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, BATCH)
        batches = {str(r.partition_key).split("|")[0] for r in result.run_requests}
        assert batches == {"sample", "good2", "empty", "latin1", "partial", "huge"}
        err = capfd.readouterr().err.splitlines()
        for name in odd:
            said = [line for line in err if name in line]
            assert len(said) == 1 and "WARNING" in said[0], (name, said)
        assert "not a regular file" in next(line for line in err if "fifo.jsonl" in line)
        again = tick(defs, instance, BATCH, result.cursor)  # said once, not on every tick
        assert not again.run_requests
        assert not [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]


def test_a_name_with_control_characters_is_shown_escaped_on_one_line(project, capfd):
    bench = project / "data" / "benchgen"
    names = ["evil\nWARNING forged line.jsonl", "\x1b[2Jclear.jsonl", "rtl\u202eldoc.jsonl"]
    for name in names:
        write_jsonl(bench / name, [task_row(9)])
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, BATCH)
        assert {str(r.partition_key).split("|")[0] for r in result.run_requests} == {"sample"}
        err = capfd.readouterr().err
        assert "\x1b[2J" not in err and "\u202e" not in err and "\nWARNING forged" not in err
        for name in names:
            said = [line for line in err.splitlines() if repr(name)[1:-1] in line]
            assert len(said) == 1 and "refused" in said[0], (name, said)
        again = tick(defs, instance, BATCH, result.cursor)
        assert "\n" not in again.skip_message and "\x1b" not in again.skip_message, again.skip_message


def test_an_unreadable_batch_file_is_named_and_the_others_go_on(project, monkeypatch, capfd):
    """A file the sensor cannot read (permissions; or deleted between listing and hashing) is
    named once and looked at again next tick; the tests run as root, so the error is injected."""
    import fugu_pipeline.defs.sensors as sensors

    write_jsonl(project / "data" / "benchgen" / "locked.jsonl", [task_row(100)])
    real = sensors.file_version

    def version(path):
        if path.name == "locked.jsonl":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(sensors, "file_version", version)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, BATCH)
        assert {str(r.partition_key).split("|")[0] for r in first.run_requests} == {"sample"}
        said = [line for line in capfd.readouterr().err.splitlines() if "locked.jsonl" in line]
        assert len(said) == 1 and "Permission denied" in said[0] and "permissions" in said[0], said
        monkeypatch.setattr(sensors, "file_version", real)
        later = tick(defs, instance, BATCH, first.cursor)
        assert {str(r.partition_key).split("|")[0] for r in later.run_requests} == {"locked"}


def test_a_file_deleted_or_rewritten_between_ticks(project):
    bench = project / "data" / "benchgen"
    write_jsonl(bench / "b2.jsonl", [task_row(100)])
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, BATCH)
        (bench / "b2.jsonl").unlink()
        gone = tick(defs, instance, BATCH, first.cursor)
        assert not gone.run_requests  # nothing to do, nothing lost: the partition stays
        assert "b2" in instance.get_dynamic_partitions("task_batches")
        write_jsonl(bench / "b2.jsonl", [task_row(100), task_row(101)])
        back = tick(defs, instance, BATCH, gone.cursor)
        assert {str(r.partition_key).split("|")[0] for r in back.run_requests} == {"b2"}
        assert not _keys(back) & _keys(first)  # a new content: new run keys
        assert _keys(tick(defs, instance, BATCH, gone.cursor)) == _keys(back)  # a re-tick: the same keys


def test_a_batch_partition_deleted_from_the_instance_comes_back(project):
    """The folder is the source of truth: a partition deleted in the UI (or an instance whose
    storage was reset while the cursors were kept) was never added again, the cursor said done."""
    defs = build_defs(str(project), one_worker(project))
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, BATCH)
        launch(defs, instance, first.run_requests)
        instance.delete_dynamic_partition("task_batches", "sample")
        back = tick(defs, instance, BATCH, first.cursor)
        assert instance.get_dynamic_partitions("task_batches") == ["sample"]
        assert not back.run_requests  # its materializations (from this very file) are still in the event log
    with dg.instance_for_test() as fresh:  # a reset instance, the old cursor kept
        back = tick(defs, fresh, BATCH, first.cursor)
        assert fresh.get_dynamic_partitions("task_batches") == ["sample"]
        assert _keys(back) == _keys(first)  # requested again (the cells on disk are not called again)
        assert not tick(defs, fresh, BATCH, back.cursor).run_requests


@pytest.mark.slow
def test_a_batch_file_reverted_to_an_earlier_content_is_collected_again(project):
    """v1 -> v2 -> v1: the run keys of the revert must differ from v1's first ones, or the daemon
    drops its runs as already launched and the batch stays on v2's prompts for good."""
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.tasks.loading import load_tasks

    bench = project / "data" / "benchgen"
    (bench / "sample.jsonl").unlink()
    v1 = [json.dumps(task_row(i)) for i in range(3)]
    v2 = [json.dumps(task_row(0, prompt="What is 0 + 1, in words?")), *v1[1:]]
    defs = build_defs(str(project), one_worker(project))
    store = ResponseStore(project / "data" / "responses")
    launched: set[str] = set()
    with dg.instance_for_test() as instance:
        cursor = None
        for rows in (v1, v2, v1):
            (bench / "b.jsonl").write_text("\n".join(rows) + "\n")
            result = tick(defs, instance, BATCH, cursor)
            keys = _keys(result)
            assert keys and not keys & launched, keys & launched  # the daemon would drop these as done
            launch(defs, instance, result.run_requests)
            launched |= keys
            cursor = result.cursor
            assert _keys(tick(defs, instance, BATCH, None)) == set()  # materialized from this very file: nothing
        want = {t.task_id: t.prompt_hash for t in load_tasks(bench / "b.jsonl")}
        for worker in instance.get_dynamic_partitions("workers"):
            assert {k: r.prompt_hash for k, r in store.read("b", worker).items()} == want


# --------------------------------------------------------------------------- the catalog sensors


class RawCatalog:
    """A loopback server whose /models answers whatever `status`, `body` and `ctype` say now."""

    def __init__(self):
        self.status, self.body, self.ctype = 200, b'{"data": []}', "application/json"
        self.endless = False  # stream '[' without end and without a length, until the client hangs up
        self.hang, self.released = False, threading.Event()  # accept, then answer nothing
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                if outer.hang:
                    outer.released.wait(30)
                    return
                if outer.endless:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    try:
                        while outer.endless:
                            self.wfile.write(b"[" * (1 << 20))
                    except OSError:
                        pass
                    return
                self.send_response(outer.status)
                self.send_header("Content-Type", outer.ctype)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def models(self, entries: list) -> None:
        self.status, self.ctype = 200, "application/json"
        self.body = json.dumps({"data": entries}).encode()

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def model(mid: str, prompt: str = "0.000001") -> dict:
    return {"id": mid, "name": mid, "pricing": {"prompt": prompt, "completion": "0.000002"}, "context_length": 1000}


@pytest.fixture
def raw_catalog(project, monkeypatch):
    cat = RawCatalog()
    (project / "configs" / "w.yaml").write_text(json.dumps({"workers": [
        {"id": "or-a", "kind": "openrouter", "model": "test/model-a", "base_url": "http://127.0.0.1:9/v1"},
        {"id": "m", "kind": "mock"}]}))
    monkeypatch.setenv("FUGU_OPENROUTER_BASE_URL", cat.url)
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    cat.models([model("test/model-a")])
    yield project, cat
    cat.close()


HOSTILE_REPLIES = {
    "malformed": (200, b'{"data": [', "application/json"),
    "html": (200, b"<html><body>Bad gateway</body></html>", "text/html"),
    "deep": (200, b"[" * 200_000 + b"]" * 200_000, "application/json"),
    "not-utf8": (200, b'{"data": [{"id": "\xff\xfe"}]}', "application/json"),
    "http-500": (500, b"oops", "text/plain"),
    "http-404": (404, b"<html>\n<body>\nnot here\n</body>\n</html>\n", "text/html"),
    "huge": (200, b'{"data": [' + json.dumps(model("test/model-a")).encode() + b"]" + b" " * (80 << 20) + b"}",
             "application/json"),  # a catalog, but 80 MiB
    "data-not-list": (200, b'{"data": {"id": "x"}}', "application/json"),
    "list": (200, b"[1, 2, 3]", "application/json"),
}


def test_a_hostile_catalog_reply_skips_the_tick_and_keeps_the_cursor(raw_catalog):
    """Every hostile reply in turn on one instance, each from the same baseline cursor: a skipped
    tick stores nothing (its cursor is the one it was given), so the replies need no instance each."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "catalog_change_sensor")
        assert first.cursor and not first.run_requests
        latest = (project / "data" / "catalog" / "latest.json").read_bytes()
        for kind in sorted(HOSTILE_REPLIES):
            cat.status, cat.body, cat.ctype = HOSTILE_REPLIES[kind]
            bad = tick(defs, instance, "catalog_change_sensor", first.cursor)
            assert not bad.run_requests and bad.cursor == first.cursor, kind
            assert bad.skip_message.startswith("catalog not fetched") and "\n" not in bad.skip_message, (kind, bad.skip_message)
            assert len(bad.skip_message) < 1000, kind
            assert (project / "data" / "catalog" / "latest.json").read_bytes() == latest, kind


def test_an_endless_catalog_reply_is_cut_and_named(raw_catalog):
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "catalog_change_sensor")
        cat.endless = True
        try:
            bad = tick(defs, instance, "catalog_change_sensor", first.cursor)
        finally:
            cat.endless = False
        assert not bad.run_requests and bad.cursor == first.cursor
        assert "catalog not fetched" in bad.skip_message and "MiB" in bad.skip_message, bad.skip_message


def test_a_catalog_that_never_answers_skips_within_the_daemons_sensor_timeout(raw_catalog, monkeypatch):
    """The daemon gives a sensor DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS (60) and fails the tick past it;
    the fetch's own deadline (30 s x 3 attempts + 5) was longer, so a hung catalog failed ticks."""
    from fugu_pipeline.defs import catalog as catalog_defs

    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    deadlines = []
    fetch = catalog_defs.fetch_catalog

    def spy(*args, **kwargs):
        deadlines.append(kwargs.get("deadline_s"))
        return fetch(*args, **kwargs)

    monkeypatch.setattr(catalog_defs, "fetch_catalog", spy)
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "catalog_change_sensor")
        monkeypatch.setenv("DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS", "6")
        cat.hang = True
        bad = tick(defs, instance, "catalog_change_sensor", first.cursor)
        assert deadlines[-1] == 3.0  # half the daemon's tick timeout, all attempts included
        assert not bad.run_requests and bad.cursor == first.cursor and "catalog not fetched" in bad.skip_message


def test_odd_catalog_contents_do_not_break_the_tick(raw_catalog):
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "catalog_change_sensor")
        odd = [model(f"vendor/m-{i}") for i in range(10_000)]
        odd += [model("../../etc/passwd"), model("a'; DROP TABLE runs; --"), model("ü/🙂 \x00 x"),
                {"id": "nan/price", "pricing": {"prompt": float("nan"), "completion": float("inf")}},  # NaN, Infinity
                {"id": 12345}, {"id": None}, {"name": "no id"}, "a string", None]
        cat.models([*odd, model("test/model-a", prompt="0.000005")])
        changed = tick(defs, instance, "catalog_change_sensor", first.cursor)
        assert "or-a" in changed.skip_message  # changed, but no batch partitions of it yet
        files = sorted(p.name for p in (project / "data" / "catalog").rglob("*"))
        assert not [f for f in files if "passwd" in f or "DROP" in f]  # no path from outside data
        assert json.loads(changed.cursor)["models"].keys() == {"test/model-a"}


def reset_folder(folder, saved) -> None:
    """Put `folder` back as `saved` holds it (the catalog sensor's only state besides its cursor)."""
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)


CORRUPT_CHANGE_CURSORS = ["garbage", "[]", '{"digest": "abc"}', '{"models": ["x"]}', '{"models": {"test/model-a": 5}}']


def test_a_corrupt_catalog_change_cursor_starts_from_the_stored_catalog(raw_catalog, tmp_path_factory, capfd):
    """Each corrupt cursor on one instance, each from the same stored catalog: data/catalog is put
    back as the baseline tick left it before every cursor (the sensor keeps nothing else)."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    folder = project / "data" / "catalog"
    with dg.instance_for_test() as instance:
        tick(defs, instance, BATCH)  # the batch and worker partitions (or-a is never collected here)
        first = tick(defs, instance, "catalog_change_sensor")  # stores data/catalog/latest.json
        saved = shutil.copytree(folder, tmp_path_factory.mktemp("catalog") / "saved")
        cat.models([model("test/model-a", prompt="0.000005")])
        for cursor in CORRUPT_CHANGE_CURSORS:
            reset_folder(folder, saved)
            capfd.readouterr()
            changed = tick(defs, instance, "catalog_change_sensor", cursor)  # compared with latest.json instead
            said = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
            assert len(said) == 1 and "cursor unreadable" in said[0] and "latest.json" in said[0], (cursor, said)
            assert len(changed.run_requests) == 1 and first.cursor != changed.cursor, cursor
            assert _keys(tick(defs, instance, "catalog_change_sensor", first.cursor)) == _keys(changed), cursor  # idempotent


CORRUPT_CATALOG_FILES = [("latest.json", "{not json"), ("latest.json", '{"models": 3}'),
                         ("retired.json", "{not json"), ("retired.json", "[1]")]


def test_a_corrupt_catalog_file_is_named_and_the_tick_goes_on(raw_catalog, tmp_path_factory, capfd):
    """Each corrupt file on one instance, each written over the files the baseline tick left."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    folder = project / "data" / "catalog"
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "catalog_change_sensor")
        saved = shutil.copytree(folder, tmp_path_factory.mktemp("catalog") / "saved")
        for name, text in CORRUPT_CATALOG_FILES:
            reset_folder(folder, saved)
            capfd.readouterr()
            (folder / name).write_text(text)
            for cursor in (None, first.cursor):
                result = tick(defs, instance, "catalog_change_sensor", cursor)  # does not raise
                assert not result.run_requests, (name, text, cursor)
                said = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
                if name == "retired.json" or cursor is None:  # a corrupt latest.json is replaced by the first tick
                    assert len(said) == 1 and name in said[0] and "delete it" in said[0], (name, text, cursor, said)
            assert json.loads((folder / "latest.json").read_text())["models"]["test/model-a"], (name, text)


def test_a_corrupt_catalog_update_cursor_relaunches_only_under_the_same_run_keys(raw_catalog):
    """Each corrupt cursor against the same two catalog materializations (the sensor only reads the
    latest one and its cursor, and stores nothing), on one instance."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        tick(defs, instance, BATCH)  # the batch and worker partitions (or-a is never collected here)
        materialize(defs, instance, "openrouter_catalog")
        cat.models([model("test/model-a", prompt="0.000005")])
        materialize(defs, instance, "openrouter_catalog")
        first = tick(defs, instance, "catalog_update_sensor")
        assert len(first.run_requests) == 1
        for cursor in ["garbage", "1.5", "-3", '{"storage_id": 4}']:
            again = tick(defs, instance, "catalog_update_sensor", cursor)
            assert _keys(again) == _keys(first) and again.cursor == first.cursor, cursor


def test_a_catalog_update_cursor_ahead_of_the_event_log_is_named_and_reset(raw_catalog, capfd):
    """The event log was reset (storage/ deleted, a new database) while the cursors were kept:
    the new storage ids start low again, and every catalog below the old cursor was ignored."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        tick(defs, instance, BATCH)
        materialize(defs, instance, "openrouter_catalog")
        cat.models([model("test/model-a", prompt="0.000005")])
        materialize(defs, instance, "openrouter_catalog")
        result = tick(defs, instance, "catalog_update_sensor", "999999")
        assert len(result.run_requests) == 1 and int(result.cursor) < 999999
        said = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line and "cursor" in line]
        assert len(said) == 1 and "ahead" in said[0], said


def test_a_hand_reported_catalog_with_odd_metadata_is_left_out(raw_catalog, capfd):
    """Each odd report in turn on one instance: the sensor reads the latest catalog materialization
    only, so each tick (from no cursor, as the original first tick) sees the report just made."""
    project, cat = raw_catalog
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        tick(defs, instance, BATCH)
        for changed in (["or-a"], {"or-a": "c769bd222142a15c"}, {"or-a": [1, 2]}, {"or-a": [None, None, "x"]}):
            capfd.readouterr()
            instance.report_runless_asset_event(dg.AssetMaterialization(
                "openrouter_catalog", metadata={"changed_workers": dg.MetadataValue.json(changed)}))
            result = tick(defs, instance, "catalog_update_sensor")
            assert not result.run_requests and result.cursor, changed
            said = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
            assert len(said) == 1 and "changed_workers" in said[0], (changed, said)
            stored = instance.fetch_materializations(dg.AssetKey("openrouter_catalog"), limit=1).records[0].storage_id
            assert result.cursor == str(stored), changed  # this very report was the one read


@pytest.fixture
def stub_project(project, monkeypatch):
    """Worker `or-a` (openrouter) behind a loopback stub that also serves the catalog."""
    import secrets

    from fugu_pipeline.testing.stub_llm import StubLLMServer

    with StubLLMServer() as stub:
        stub.add_model("test/model-a", prompt=1e-6, completion=2e-6)
        (project / "data" / "benchgen" / "sample.jsonl").unlink()
        write_jsonl(project / "data" / "benchgen" / "b1.jsonl", [task_row(i) for i in range(2)])
        (project / "configs" / "w.yaml").write_text(json.dumps({"workers": [
            {"id": "or-a", "kind": "openrouter", "model": "test/model-a", "base_url": stub.openrouter_url}]}))
        monkeypatch.setenv("FUGU_OPENROUTER_BASE_URL", stub.openrouter_url)
        monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + secrets.token_hex(20))
        yield project, stub


@pytest.mark.slow
@pytest.mark.parametrize("sensor", ["catalog_change_sensor", "catalog_update_sensor"])
def test_a_price_that_flips_back_and_forth_recollects_every_time(stub_project, sensor):
    """A -> B -> A -> B: the second A -> B change must not reuse the first one's run keys, or the
    daemon drops it and the cells stay answered under A while the catalog says B."""
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.workers.catalog import load_latest

    project, stub = stub_project
    defs = build_defs(str(project), "configs/w.yaml")
    store = ResponseStore(project / "data" / "responses")
    launched: set[str] = set()
    with dg.instance_for_test() as instance:
        launch(defs, instance, tick(defs, instance, BATCH).run_requests)
        if sensor == "catalog_update_sensor":
            materialize(defs, instance, "openrouter_catalog")
        cursor = tick(defs, instance, sensor).cursor
        for price in (5e-6, 1e-6, 5e-6):
            stub.set_price("test/model-a", prompt=price)
            if sensor == "catalog_update_sensor":
                materialize(defs, instance, "openrouter_catalog")
            result = tick(defs, instance, sensor, cursor)
            keys = _keys(result)
            assert len(keys) == 1 and not keys & launched, (price, keys & launched)
            assert _keys(tick(defs, instance, sensor, cursor)) == keys  # the same change again: the same run keys
            launch(defs, instance, result.run_requests)
            launched |= keys
            cursor = result.cursor
            fp = load_latest(project / "data" / "catalog").fingerprint("test/model-a")
            assert {r.model_fingerprint for r in store.read("b1", "or-a").values()} == {fp}


@pytest.mark.parametrize("text", ["workers: [ {id: a, kind: mock}\n", "workers: [{id: a, kind: nope}]\n", None])
def test_a_broken_worker_config_skips_the_sensors_in_one_line_and_keeps_their_cursors(project, text):
    config = project / "configs" / "w.yaml"
    defs = build_defs(str(project), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        for sensor in (BATCH, "catalog_change_sensor"):
            if text is not None:
                config.write_text(text)
            result = tick(defs, instance, sensor, "kept")
            assert not result.run_requests and result.cursor == "kept"
            assert "w.yaml" in result.skip_message and "\n" not in result.skip_message, result.skip_message
        config.write_text(json.dumps({"workers": [{"id": "a", "kind": "mock"}]}))  # fixed: the batches go on
        assert {str(r.partition_key).split("|")[0] for r in tick(defs, instance, BATCH).run_requests} == {"sample"}


@pytest.mark.slow
def test_a_worker_removed_then_put_back_is_collected_on_the_batches_it_missed(project):
    """A worker taken out of the config keeps its partition; put back, it was not "new", so the
    batches that arrived meanwhile were never collected for it (and the matrix's cells stayed
    missing)."""
    from fugu_pipeline.collect.store import ResponseStore

    bench = project / "data" / "benchgen"
    (bench / "sample.jsonl").unlink()
    write_jsonl(bench / "b1.jsonl", [task_row(i) for i in range(2)])
    config = project / "configs" / "w.yaml"
    both = {"workers": [{"id": "a", "kind": "mock"}, {"id": "b", "kind": "mock"}]}
    config.write_text(json.dumps(both))
    defs = build_defs(str(project), "configs/w.yaml")
    store = ResponseStore(project / "data" / "responses")
    launched: set[str] = set()
    with dg.instance_for_test() as instance:

        def step(cursor, fresh=True):
            result = tick(defs, instance, BATCH, cursor)
            assert not (fresh and _keys(result) & launched)
            if fresh:  # a re-tick from the same cursor: the same keys
                assert _keys(tick(defs, instance, BATCH, cursor)) == _keys(result)
            launch(defs, instance, result.run_requests)
            launched.update(_keys(result))
            return result

        cursor = step(None).cursor
        config.write_text(json.dumps({"workers": both["workers"][:1]}))
        write_jsonl(bench / "b2.jsonl", [task_row(i) for i in range(10, 12)])
        cursor = step(cursor).cursor
        assert not store.read("b2", "b")
        config.write_text(json.dumps(both))  # back, while b1 changes: one run per partition, not two
        write_jsonl(bench / "b1.jsonl", [task_row(i) for i in range(3)])
        result = step(cursor)
        parts = [str(r.partition_key) for r in result.run_requests]
        assert len(parts) == len(set(parts)) and {"b1|a", "b1|b", "b2|b"} <= set(parts), parts
        assert set(store.read("b2", "b")) == {"t10", "t11"}
        instance.delete_dynamic_partition("workers", "b")
        again = step(result.cursor, fresh=False)  # re-added; its requests repeat the last join's keys (same files)
        assert "b" in instance.get_dynamic_partitions("workers") and _keys(again) <= launched
