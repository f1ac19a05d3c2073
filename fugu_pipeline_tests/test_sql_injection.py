"""Hostile reward files: a worker id that closes the SQL quote must not run anything.

The payload below was reproduced against the old `reward_wide` view, whose PIVOT pasted worker ids
into SQL: DuckDB ran the `COPY ... TO` and wrote the file. Each test goes through a path a user
takes (`fugu-lite import jsonl`, `fugu-lite train-sft --data`, the `reward_matrix` asset with
`import_path`) and checks that the target file was NOT written and that the error names the
file, the line and the rule.
"""

import ast
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.matrix.build import MatrixInput, TaskRow, build
from fugu_pipeline.matrix.import_format import IMPORT_WORKER_ID_PATTERN
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline_tests.conftest import REPO, write_jsonl


def hostile_id(target: Path) -> str:
    """Closes the quote of `IN ('...')`, ends the view, writes `target`, then reopens a statement
    so the rest of the old SQL still parses."""
    return ("x') USING first(utility) GROUP BY task_id) p USING (task_id); "
            f"COPY (SELECT 'pwned' AS x) TO '{target}' (HEADER false); "
            "CREATE VIEW zz AS SELECT * FROM (SELECT 1 AS task_id) q JOIN (SELECT 1 AS task_id WHERE 'a' IN ('")


def hostile_file(tmp_path: Path, target: Path, bad_line: int = 2) -> Path:
    rows = []
    for i in range(4):
        ids = [hostile_id(target), "b"] if i + 1 >= bad_line else ["a", "b"]
        rows.append({"task_id": f"t{i}", "prompt": f"prompt {i}", "split": ["train", "val", "test", "train"][i],
                     "worker_ids": ids, "rewards": [0.5, 0.1 * i]})
    return write_jsonl(tmp_path / "evil.jsonl", rows)


def assert_names_file_line_and_rule(text: str, path: Path, line: int) -> None:
    assert f"{path}:{line}:" in text, text
    assert IMPORT_WORKER_ID_PATTERN in text and "invalid worker id" in text


def test_fugu_lite_import_jsonl_refuses_the_hostile_id(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "pwned.txt"
    path = hostile_file(tmp_path, target)
    assert main(["import", "jsonl", str(path), "--output", "out.jsonl"]) == 2
    err = capsys.readouterr().err
    assert_names_file_line_and_rule(err, path, 2)
    assert "Traceback" not in err
    assert not target.exists() and not (tmp_path / "out.jsonl").exists()


def test_train_sft_on_the_hostile_file_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "pwned.txt"
    path = hostile_file(tmp_path, target, bad_line=1)
    assert main(["train-sft", "--data", str(path), "--encoder", "tiny", "--device", "cpu",
                 "--config", str(REPO / "configs" / "train_sft.yaml")]) == 2
    assert_names_file_line_and_rule(capsys.readouterr().err, path, 1)
    assert not target.exists() and not (tmp_path / "models").exists()
    assert not [p for p in tmp_path.rglob("*") if p.suffix == ".duckdb" or ".duckdb.tmp" in p.name]


def test_reward_matrix_asset_with_import_path_refuses_the_hostile_id(project, tmp_path):
    target = tmp_path / "pwned.txt"
    path = hostile_file(tmp_path, target, bad_line=3)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")], raise_on_error=False,
            run_config={"ops": {"reward_matrix": {"config": {"import_path": str(path)}}}},
        )
        assert not res.success
        failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
        # the step failure is one line naming the file by its name (its full path is the `file` metadata)
        assert_names_file_line_and_rule(str(failure.event_specific_data.error), Path(path.name), 3)
    assert not target.exists()
    assert not (project / "data" / "reward_matrix.duckdb").exists()


def test_build_refuses_a_bad_id_from_any_source(tmp_path):
    """Defence in depth: `build()` checks ids itself, for sources other than the import format."""
    target = tmp_path / "pwned.txt"
    inp = MatrixInput([TaskRow("t1", "b", "p", "math", "train")], [(hostile_id(target), "x", None)], [], [],
                      "test", UtilityConfig())
    with pytest.raises(ValueError, match="invalid worker id"):
        build(inp, tmp_path / "m.duckdb")
    assert not target.exists() and not list(tmp_path.glob("m.duckdb*"))


def test_reward_wide_takes_ids_as_column_names_not_sql(tmp_path):
    """Ids with the characters the rule allows ('.', '-', '_', '/', ':') come out as columns, in order;
    ids that differ only in case (DuckDB names ignore case) are refused with a clear message."""
    ids = ["z.last", "a-first", "mistralai/Mixtral-8x7B-Instruct-v0.1", "qwen/qwen3-8b:free"]
    rows = [{"task_id": f"t{i}", "prompt": f"p{i}", "worker_ids": ids, "rewards": [0.1 * i, 0.2, 0.3, 0.4]} for i in range(3)]
    db = tmp_path / "m.duckdb"
    from fugu_pipeline.matrix.build import from_import

    build(from_import(write_jsonl(tmp_path / "ok.jsonl", rows), UtilityConfig()), db)
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT * FROM reward_wide").fetchall()
    cols = [d[0] for d in con.description]
    con.close()
    assert cols == ["task_id", "split", "domain", *ids]
    assert got[1] == ("t1", "train", "general", pytest.approx(0.1), 0.2, 0.3, 0.4)
    clash = [{"task_id": "t1", "prompt": "p", "worker_ids": ["Alpha", "alpha"], "rewards": [1, 0]}]
    with pytest.raises(ValueError, match="ignore case"):
        build(from_import(write_jsonl(tmp_path / "clash.jsonl", clash), UtilityConfig()), tmp_path / "c.duckdb")


SQL_CALLS = {"execute", "executemany", "sql", "query"}
ALLOWED = {
    ("matrix/build.py", "_insert"),  # interpolates this module's own table/column names, checked
    ("matrix/build.py", "data_version"),  # one of two module constants, chosen by a condition
    # the bulk build adds and drops its own bookkeeping columns (names and types: module constants)
    ("matrix/bulk.py", "build_collection"),
    ("matrix/bulk_tasks.py", "_python_rows"),
    ("matrix/bulk_tasks.py", "read_batches"),
}


def test_no_sql_is_built_from_strings_anywhere_in_the_package():
    """Every SQL statement the package runs is a literal (or an UPPER_CASE module constant); the one
    exception interpolates names checked against the schema, never data."""
    root = REPO / "fugu_pipeline"
    found = []

    def visit(node, where: str, path: Path) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_CALLS
                and node.args):
            arg = node.args[0]
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            constant = isinstance(arg, ast.Name) and arg.id.isupper()
            if not (literal or constant):
                found.append((str(path.relative_to(root)), where, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, where, path)

    for path in root.rglob("*.py"):
        visit(ast.parse(path.read_text()), "<module>", path)
    bad = sorted({(f, n, line) for f, n, line in found if (f, n) not in ALLOWED})
    assert bad == [], f"SQL built from non-literal strings: {bad}"
    assert {(f, n) for f, n, _ in found} <= ALLOWED


def test_the_payload_is_real(tmp_path):
    """The payload does run through string-pasted SQL (what the old code did), so the tests above
    test something: pasted into the old PIVOT, DuckDB writes the file."""
    target = tmp_path / "pwned.txt"
    con = duckdb.connect()
    con.execute("CREATE TABLE tasks (task_id VARCHAR, split VARCHAR, domain VARCHAR); "
                "CREATE TABLE rewards (task_id VARCHAR, worker_id VARCHAR, utility DOUBLE)")
    cols = ", ".join(f"'{w}'" for w in [hostile_id(target), "b"])
    old = ("CREATE VIEW reward_wide AS SELECT t.task_id, t.split, t.domain, p.* EXCLUDE (task_id) FROM tasks t "
           f"JOIN (PIVOT (SELECT task_id, worker_id, utility FROM rewards) ON worker_id IN ({cols}) "
           "USING first(utility) GROUP BY task_id) p USING (task_id) ORDER BY t.task_id")
    with pytest.raises(duckdb.Error):
        con.execute(old)
    assert target.read_text().strip() == "pwned"
