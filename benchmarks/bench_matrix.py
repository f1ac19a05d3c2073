"""Benchmark the reward-matrix build at scale (not a test).

Generates a project of N tasks x W workers of stored responses (BenchGen batch files and one
response file per partition, written the way the collector writes them), then builds the matrix
in a fresh process and prints wall time, peak memory (the build process's max RSS) and where the
time goes, side by side with two bare DuckDB `read_json`s of the same response and batch files (its
floors, nothing checked or kept): `count(*)` (every line parsed, no field typed) and the typed floor
(every field the build reads, with the build's own column spec from `matrix/bulk.py` and
`matrix/bulk_tasks.py`, every value consumed by an aggregate), and the native-typed floor (the same
fields read straight into DuckDB's own types: cheaper, but blind to a field's JSON type, which the
build must check, so it bounds from below any build made on DuckDB's JSON reader), alternated `--repeats` times:

    python benchmarks/bench_matrix.py --tasks 100000 --workers 5                # the bulk build vs read_json
    python benchmarks/bench_matrix.py --tasks 100000 --workers 5 --rows         # also the row-by-row build
    python benchmarks/bench_matrix.py --tasks 100000 --workers 5 --store s3     # responses from a loopback S3
    python benchmarks/bench_matrix.py --tasks 1000000 --workers 20 --store file # from a shared folder (NFS-like)

`--store s3` starts moto in server mode on loopback, uploads the response files, and builds on a
second, empty project folder that pulls them (defs/shared.py); `--store file` does the same
through a `file://` store. The generated data goes under --dir (default: a temporary folder,
removed after).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo's benchmarks package
from benchmarks.machine import describe  # noqa: E402

WORKER_YAML = """reward: {{quality_weight: 1.0, cost_weight: 0.1, latency_weight: 0.05, cost_scale_usd: 0.01, latency_scale_s: 10.0}}
workers:
{workers}
"""
DOMAINS = ("math", "code", "general")
SPLITS = ("train", "train", "train", "val", "test")
LINE = ('{{"task_id":"{t}","worker_id":"{w}","batch":"{b}","prompt_hash":"{h}","status":"ok","answer":"{a}",'
        '"quality":{q},"grade_detail":"numeric: expected {a}","cost_usd":{c},"cost_source":"mock","judge_cost_usd":0.0,'
        '"latency_s":{lat},"ttft_s":{ttft},"prompt_tokens":54,"completion_tokens":18,"finish_reason":"stop",'
        '"requested_model":"mock/{w}","served_model":"mock/{w}","provider":"mock","attempts":1,"error":null,'
        '"model_fingerprint":null,"finished_at":{f}}}\n')


def generate(root: Path, n_tasks: int, n_workers: int, batch_size: int, seed: int = 0) -> dict:
    """Write the project: configs/workers.bench.yaml, data/benchgen/*.jsonl, data/responses/."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    workers = [f"w{j:02d}" for j in range(n_workers)]
    (root / "configs").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "workers.bench.yaml").write_text(WORKER_YAML.format(workers="\n".join(
        f"  - {{id: {w}, kind: mock}}" for w in workers)))
    bench, resp = root / "data" / "benchgen", root / "data" / "responses"
    bench.mkdir(parents=True, exist_ok=True)
    n_bytes = 0
    for start in range(0, n_tasks, batch_size):
        b = f"b{start // batch_size:04d}"
        ids = [f"t{i:08d}" for i in range(start, min(start + batch_size, n_tasks))]
        prompts = [f"Task {i}: a {DOMAINS[i % 3]} question whose answer is a number; what is {i} + {i % 97} "
                   f"after doubling it and subtracting {i % 13}? Give the number only." for i in range(start, start + len(ids))]
        hashes = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        with (bench / f"{b}.jsonl").open("w") as fh:
            for i, (tid, p) in enumerate(zip(ids, prompts)):
                fh.write(json.dumps({"task_id": tid, "prompt": p, "domain": DOMAINS[(start + i) % 3], "reference_answer": "1",
                                     "grader": {"type": "numeric"}, "split": SPLITS[(start + i) % 5]}) + "\n")
        (resp / b).mkdir(parents=True, exist_ok=True)
        for w in workers:
            q = (rng.random(len(ids)) < 0.6).astype(float)
            cost = np.round(rng.random(len(ids)) * 0.004, 8)
            lat = np.round(0.5 + rng.random(len(ids)) * 3, 4)
            fin = 1.79e9 + np.arange(len(ids)) * 0.01
            with (resp / b / f"{w}.jsonl").open("w") as fh:
                fh.writelines(LINE.format(t=tid, w=w, b=b, h=h, a=int(i % 91), q=repr(float(qq)), c=repr(float(cc)),
                                          lat=repr(float(ll)), ttft=repr(round(float(ll) * 0.3, 4)), f=repr(float(ff)))
                              for i, (tid, h, qq, cc, ll, ff) in enumerate(zip(ids, hashes, q, cost, lat, fin)))
            n_bytes += (resp / b / f"{w}.jsonl").stat().st_size
    return {"tasks": n_tasks, "workers": n_workers, "batches": -(-n_tasks // batch_size),
            "response_bytes": n_bytes, "generate_s": round(time.perf_counter() - t0, 1)}


BUILD = """
import json, resource, sys, time
from pathlib import Path
root, mode = Path(sys.argv[1]), sys.argv[2]
if mode == "floor":  # DuckDB's JSON reader alone over the same files: every line parsed, nothing kept
    import duckdb
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    counts = {}
    for what, pattern in (("response lines", "data/responses/*/*.jsonl"), ("task lines", "data/benchgen/*.jsonl")):
        files = sorted(str(p) for p in root.glob(pattern))
        counts[what] = con.execute("SELECT count(*) FROM read_json(?, format='newline_delimited')", [files]).fetchone()[0]
    print(json.dumps({"wall_s": round(time.perf_counter() - t0, 2),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "read": counts}))
    sys.exit(0)
if mode in ("typed_floor", "native_floor"):  # read_json of the same files typing every field the build reads, each consumed
    import duckdb
    from fugu_pipeline.matrix.bulk import FIRST_OBJECT_BYTES, RECORD_COLUMNS, RECORD_FIELDS, _COUNTS, _NUMBERS
    from fugu_pipeline.matrix.bulk_tasks import FIELD_TYPES

    native = mode == "native_floor"  # DuckDB's own types: strings, doubles, integers, a list of strings for tags
    record_types = {c: ("DOUBLE" if c in _NUMBERS else "BIGINT" if c in _COUNTS else "VARCHAR") if native else "JSON"
                    for c in RECORD_FIELDS}
    task_types = {k: v if not native else "VARCHAR[]" if k == "tags" else
                  {g: "VARCHAR" for g in v} if isinstance(v, dict) else "VARCHAR" for k, v in FIELD_TYPES.items()}

    def sql_type(kind):
        return kind if isinstance(kind, str) else "STRUCT(" + ", ".join(f'"{k}" {sql_type(v)}' for k, v in kind.items()) + ")"

    def leaves(name, kind):
        return [(name, kind)] if isinstance(kind, str) else [x for k, v in kind.items() for x in leaves(f'{name}."{k}"', v)]

    def spec(types):
        return "{" + ", ".join(f"'{k}': '{sql_type(v)}'" for k, v in types.items()) + "}"

    # the typed floor reads with the build's own spec (`RECORD_COLUMNS`), the native one with DuckDB's types
    reads = (("response lines", "data/responses/*/*.jsonl", spec(record_types) if native else RECORD_COLUMNS,
              [(f'"{c}"', k) for c, k in record_types.items()]),
             ("task lines", "data/benchgen/*.jsonl", spec(task_types), [x for k, v in task_types.items() for x in leaves(f'"{k}"', v)]))
    t0 = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    counts = {}
    for what, pattern, columns, fields in reads:
        files = sorted(str(p) for p in root.glob(pattern))
        # every field's text read whole; a number or a list consumed too
        used = " + ".join(f"coalesce(sum({'strlen' if k in ('JSON', 'VARCHAR') else 'len' if k.endswith('[]') else ''}({c})), 0)"
                          for c, k in fields)
        counts[what] = con.execute(f"SELECT count(*), {used} FROM read_json(?, format='newline_delimited', records=true, "
                                   f"columns={columns}, ignore_errors=true, maximum_object_size={FIRST_OBJECT_BYTES})",
                                   [files]).fetchone()
    print(json.dumps({"wall_s": round(time.perf_counter() - t0, 2),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "read": {k: {"lines": n, ("values_sum" if native else "field_bytes"): b} for k, (n, b) in counts.items()}}))
    sys.exit(0)
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline.matrix.bulk import build_collection  # imported before the clock starts, as duckdb is for read_json
cfg = load_workers_config(root / "configs" / "workers.bench.yaml")
timings = {}
t0 = time.perf_counter()
if mode == "pull":
    from fugu_pipeline.defs.shared import SharedStore
    from fugu_pipeline.paths import ProjectPaths
    n = SharedStore.of(ProjectPaths(root)).pull_all_responses()
    timings["pull from the shared store"] = round(time.perf_counter() - t0, 3)
    timings["files pulled"] = n
if mode in ("bulk", "pull"):
    t1 = time.perf_counter()
    summary = build_collection(root / "data" / "benchgen", root / "data" / "responses", cfg, root / "data" / "m.duckdb",
                               timings=timings)
else:
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.matrix.build import build, from_collection
    inp = from_collection(root / "data" / "benchgen", ResponseStore(root / "data" / "responses"), cfg)
    timings["read files and records in Python"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    summary = build(inp, root / "data" / "m.duckdb")
    timings["build"] = round(time.perf_counter() - t1, 3)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": round(wall, 2), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "timings": timings, "summary": summary}))
"""


def build_in_fresh_process(root: Path, mode: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", BUILD, str(root), mode], capture_output=True, text=True,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith('{"wall_s"'))
    return json.loads(line)


def side_by_side(root: Path, repeats: int) -> list[dict]:
    """The bulk build and three bare `read_json`s of the same files (response and batch files), each in
    a fresh process, alternated `repeats` times so that load from other processes falls on all of them:
    `count(*)` (DuckDB reads no field: it only finds the lines), the typed floor (every field the
    build reads, with the build's own read spec, each value consumed) and the native-typed floor (the
    same fields in DuckDB's own types)."""
    runs = []
    for r in range(repeats):
        load = os.getloadavg()[0]
        floor = build_in_fresh_process(root, "floor")
        typed = build_in_fresh_process(root, "typed_floor")
        native = build_in_fresh_process(root, "native_floor")
        bulk = build_in_fresh_process(root, "bulk")
        runs.append({"load_average_1min": load, "floor": floor, "typed_floor": typed, "native_floor": native, "bulk": bulk})
        print(f"run {r + 1}/{repeats} (load {load:.2f} -> {os.getloadavg()[0]:.2f}): read_json of the same files "
              f"{floor['wall_s']:.2f} s, {floor['peak_rss_mib']} MiB | bulk build {bulk['wall_s']:.2f} s, "
              f"{bulk['peak_rss_mib']} MiB | build / read_json = {bulk['wall_s'] / floor['wall_s']:.2f}x", flush=True)
        print(f"  typed floor (read_json typing every field the build reads, all consumed) {typed['wall_s']:.2f} s, "
              f"{typed['peak_rss_mib']} MiB | build / typed floor = {bulk['wall_s'] / typed['wall_s']:.2f}x", flush=True)
        print(f"  native-typed floor (the same fields in DuckDB's own types: the cheapest typed read, blind to a field's "
              f"JSON type) {native['wall_s']:.2f} s | native-typed floor / read_json = {native['wall_s'] / floor['wall_s']:.2f}x",
              flush=True)
        print("  phases:", json.dumps(bulk["timings"]), flush=True)
    best_floor = min(x["floor"]["wall_s"] for x in runs)
    best_typed = min(x["typed_floor"]["wall_s"] for x in runs)
    best_bulk = min(x["bulk"]["wall_s"] for x in runs)
    print(f"best of {repeats}: read_json {best_floor:.2f} s, bulk build {best_bulk:.2f} s -> {best_bulk / best_floor:.2f}x "
          f"(aim <= 1.5x); summary {json.dumps(runs[-1]['bulk']['summary'])}", flush=True)
    print(f"best of {repeats}: typed floor {best_typed:.2f} s, bulk build {best_bulk:.2f} s -> "
          f"{best_bulk / best_typed:.2f}x (build / read_json count(*) {best_bulk / best_floor:.2f}x)", flush=True)
    best_native = min(x["native_floor"]["wall_s"] for x in runs)
    print(f"best of {repeats}: native-typed floor {best_native:.2f} s = {best_native / best_floor:.2f}x read_json count(*) "
          "(where this is over 1.5x, no build on DuckDB's JSON reader that types the fields can be within 1.5x)", flush=True)
    return runs


def machine() -> str:
    import duckdb

    return f"{describe()}; Python {sys.version.split()[0]}, duckdb {duckdb.__version__}"


def via_store(src: Path, kind: str) -> tuple[Path, dict, dict]:
    """Upload the response files to a store; return a second project folder (no responses) and
    the environment that points it at the store."""
    from fugu_pipeline import storage

    other = src.parent / (src.name + "-machine-b")
    shutil.rmtree(other, ignore_errors=True)
    (other / "data").mkdir(parents=True)
    shutil.copytree(src / "configs", other / "configs")
    shutil.copytree(src / "data" / "benchgen", other / "data" / "benchgen")
    env: dict = {}
    extra: dict = {}
    if kind == "file":
        shared = src.parent / (src.name + "-store")
        shutil.rmtree(shared, ignore_errors=True)
        t0 = time.perf_counter()
        shutil.copytree(src / "data" / "responses", shared / "data" / "responses")
        extra["upload_s"] = round(time.perf_counter() - t0, 1)
        env["FUGU_DATA_URL"] = f"file://{shared / 'data'}"
        return other, env, extra
    port = _free_port()
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    extra["_moto"] = moto
    env.update({"FUGU_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1", "FUGU_DATA_URL": "s3://fugu-bench/data"})
    os.environ.update(env)
    for _ in range(100):
        try:
            storage.filesystem("s3://fugu-bench").mkdir("fugu-bench")
            break
        except Exception:  # noqa: BLE001  (the server is still starting)
            time.sleep(0.1)
    t0 = time.perf_counter()
    for f in sorted((src / "data" / "responses").rglob("*.jsonl")):
        storage.put_bytes(f"s3://fugu-bench/data/responses/{f.parent.name}/{f.name}", f.read_bytes())
    extra["upload_s"] = round(time.perf_counter() - t0, 1)
    return other, env, extra


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--rows", action="store_true", help="also time the row-by-row build (build(from_collection(...)))")
    ap.add_argument("--store", choices=["s3", "file"], help="build on a second folder from a shared store")
    ap.add_argument("--dir", help="where to generate (kept); default: a temporary folder, removed after")
    ap.add_argument("--store-only", action="store_true", help="with --store: skip the local build, build only from the store")
    ap.add_argument("--repeats", type=int, default=2, help="bulk build and read_json runs, alternated (default 2)")
    ap.add_argument("--reuse", action="store_true", help="with --dir: use the data already generated there")
    args = ap.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fugu-bench-matrix-"))
    report: dict = {"machine": machine(), "load_average_before": os.getloadavg()}
    try:
        marker = root / "generated.json"
        reused = args.reuse and marker.exists()
        if reused:
            report["data"] = json.loads(marker.read_text())
        else:
            report["data"] = generate(root, args.tasks, args.workers, args.batch_size)
            marker.write_text(json.dumps(report["data"]))
        data = report["data"]  # with --reuse, the sizes of the data found there, whatever the flags say
        print(f"{'reused' if reused else 'generated'} {data['tasks']:,} tasks x {data['workers']} workers: "
              f"{data['response_bytes'] / 2**20:,.0f} MiB of response files (generated in {data['generate_s']}s)", flush=True)
        if not (args.store and args.store_only):
            report["side_by_side"] = side_by_side(root, args.repeats)
            report["bulk"] = min(report["side_by_side"], key=lambda r: r["bulk"]["wall_s"])["bulk"]
        if args.rows:
            report["rows"] = build_in_fresh_process(root, "rows")
            print("row-by-row build:", json.dumps(report["rows"], indent=1), flush=True)
            a, b = report["bulk"]["summary"]["data_version"], report["rows"]["summary"]["data_version"]
            print(f"same data_version: {a == b} ({a}); speed-up {report['rows']['wall_s'] / report['bulk']['wall_s']:.1f}x")
        if args.store:
            other, env, extra = via_store(root, args.store)
            moto = extra.pop("_moto", None)
            try:
                report["store"] = {**extra, **build_in_fresh_process(other, "pull", env)}
            finally:
                if moto is not None:
                    moto.terminate()
                    moto.wait(10)
            print(f"from the shared store ({args.store}):", json.dumps(report["store"], indent=1), flush=True)
            if "bulk" in report:
                same = report["store"]["summary"]["data_version"] == report["bulk"]["summary"]["data_version"]
                print(f"same data_version as the local build: {same}")
    finally:
        if not args.dir:
            for p in (root, root.parent / (root.name + "-machine-b"), root.parent / (root.name + "-store")):
                shutil.rmtree(p, ignore_errors=True)
    report["load_average_after"] = os.getloadavg()  # other work on the machine shares its 2 cores
    print(json.dumps({k: v for k, v in report.items()}, default=str))
    _ = resource  # (peak RSS is the build process's own, read inside it)


if __name__ == "__main__":
    main()
