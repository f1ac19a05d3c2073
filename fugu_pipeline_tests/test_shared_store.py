"""The shared store against a loopback S3 (moto in server mode): whole-object and conditional
PUTs, retries of 500/503, a slow store, clear errors, and a checkpoint promoted on one "machine"
(a process with its own folder) and loaded by `load_promoted` on another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fugu_pipeline_tests.faulty_proxy import FaultyProxy
from fugu_pipeline_tests.services import REPO, Service, installed

BUCKET = "fugu-shared"


@pytest.fixture(scope="module")
def s3():
    reason = installed("s3")
    if reason:
        pytest.skip(reason)
    svc = Service("s3").start()
    yield svc
    svc.cleanup()


def _store_env(endpoint: str) -> dict[str, str]:
    return {"FUGU_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def store(s3, monkeypatch):
    from fugu_pipeline import storage

    for k, v in _store_env(s3.url).items():
        monkeypatch.setenv(k, v)
    storage._FS_CACHE.clear()
    fs = storage.filesystem(f"s3://{BUCKET}")
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    yield storage
    storage._FS_CACHE.clear()


def test_whole_object_and_conditional_puts(store):
    url = f"s3://{BUCKET}/t1/current.json"
    store.put_bytes(url, b'{"v": 1}')
    assert store.get_bytes(url) == b'{"v": 1}'
    with pytest.raises(store.PreconditionFailed):
        store.put_bytes(url, b'{"v": 2}', if_absent=True)  # first writer wins
    seen = store.etag(url)
    store.put_bytes(url, b'{"v": 3}', if_match=seen)
    with pytest.raises(store.PreconditionFailed):
        store.put_bytes(url, b'{"v": 4}', if_match=seen)  # replaced since it was read: refused
    assert store.get_bytes(url) == b'{"v": 3}'
    assert store.get_bytes(f"s3://{BUCKET}/t1/absent.json") is None
    store.remove(url)
    assert store.get_bytes(url) is None and store.list_names(f"s3://{BUCKET}/t1") == {}
    store.remove(url)  # already gone: no error


def test_503s_are_retried_and_a_500_that_stays_names_service_and_settings(s3, store, monkeypatch):
    with FaultyProxy(s3.port) as proxy:
        monkeypatch.setenv("FUGU_S3_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("FUGU_STORE_RETRIES", "4")
        store._FS_CACHE.clear()
        url = f"s3://{BUCKET}/t2/p.json"
        proxy.fail_next, proxy.fail_status = 2, 503
        store.put_bytes(url, b"whole")  # two 503s, then through
        assert proxy.failed == 2 and store.get_bytes(url) == b"whole"

        proxy.fail_always, proxy.fail_status = True, 500
        t0 = time.monotonic()
        with pytest.raises(store.StoreError) as err:
            store.get_bytes(url)
        msg = str(err.value)
        print("500 that stays:", msg, f"({time.monotonic() - t0:.1f}s)")
        assert f"S3 at http://127.0.0.1:{proxy.port}" in msg and "GET" in msg and "after 4 attempt(s)" in msg
        assert "FUGU_S3_ENDPOINT_URL" in msg and "FUGU_STORE_RETRIES=4" in msg


def test_a_slow_store_times_out_with_a_clear_error(s3, store, monkeypatch):
    with FaultyProxy(s3.port) as proxy:
        monkeypatch.setenv("FUGU_S3_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("FUGU_STORE_RETRIES", "2")
        monkeypatch.setenv("FUGU_STORE_TIMEOUT_S", "1")
        store._FS_CACHE.clear()
        proxy.delay_s = 3.0
        t0 = time.monotonic()
        with pytest.raises(store.StoreError) as err:
            store.get_bytes(f"s3://{BUCKET}/t3/slow.json")
        msg, took = str(err.value), time.monotonic() - t0
        print("slow store:", msg, f"({took:.1f}s)")
        assert "after 2 attempt(s)" in msg and "FUGU_STORE_TIMEOUT_S=1" in msg and "timeout" in msg.lower()


MACHINE_B = """
import json, os, sys
from fugu_pipeline import load_promoted
from fugu_pipeline.cost_cap import CostCap
router = load_promoted(sys.argv[1], device="cpu")
d = router.route("What is 17 * 3?", domain="math")
# with a cap (argv[2], a share of the strongest's cost): the budget calibration beside the weights is read
capped = router.route("What is 17 * 3?", domain="math", budget=CostCap(share=float(sys.argv[2]))) if sys.argv[2:] else d
path = str(router.router.checkpoint.path)
print(json.dumps({"worker": d.worker_id, "checkpoint": path, "files": sorted(os.listdir(path)),
                  "content_hash": router.router.checkpoint.manifest.content_hash, "capped": capped.worker_id}))
"""


@pytest.mark.slow
def test_promoted_on_one_machine_loaded_on_another(s3, store, tmp_path, monkeypatch):
    """Machine A is this process (its own folder); machine B another process that knows only the
    store's URL and has an empty folder of its own."""
    from fugu_pipeline.defs.shared import SharedStore
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.testing.serving import build_checkpoints

    models_url = f"s3://{BUCKET}/roundtrip/models"
    env = {**os.environ, **_store_env(s3.url), "FUGU_MODELS_URL": models_url, "FUGU_DATA_URL": f"s3://{BUCKET}/roundtrip/data"}
    monkeypatch.setenv("FUGU_MODELS_URL", models_url)
    monkeypatch.setenv("FUGU_DATA_URL", f"s3://{BUCKET}/roundtrip/data")
    paths = ProjectPaths(tmp_path / "machine-a")
    # trains a quality SFT head, draws its budget calibration beside it (budget.json) and promotes it locally
    ckpt = build_checkpoints(paths.models, seeds=(0,), epochs=5, head="quality")[0]
    assert (ckpt / "budget.json").is_file()
    assert SharedStore.of(paths).push_promoted(None)  # no pointer on the store yet: checkpoint (manifest last), then the pointer
    pointer = json.loads((paths.models / "promoted" / "current.json").read_text())
    env_b = {**env, "FUGU_STORE_CACHE": str(tmp_path / "machine-b" / "cache")}
    env_b.pop("FUGU_MODELS_URL")  # B knows only the URL it is given
    b = subprocess.run([sys.executable, "-c", MACHINE_B, models_url, "0.5"], env=env_b, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr[-3000:]
    got = json.loads(b.stdout.strip().splitlines()[-1])
    print("machine A promoted:", pointer["checkpoint"], "| machine B routed with:", got)
    assert got["content_hash"] == pointer["content_hash"]
    assert got["checkpoint"].startswith(str(tmp_path / "machine-b" / "cache"))  # B's own copy, from the store
    assert not (tmp_path / "machine-b" / "models").exists()
    assert got["worker"] in ("alpha", "beta", "gamma") and got["capped"] in ("alpha", "beta", "gamma")
    for name in ("head.safetensors", "manifest.json", "budget.json"):  # every file of the folder, byte for byte
        assert (Path(got["checkpoint"]) / name).read_bytes() == (ckpt / name).read_bytes(), name


@pytest.mark.slow
def test_two_machines_share_responses_embeddings_and_the_promoted_router(s3, store, tmp_path):
    """Machine A runs the main job against the store; machine B, an empty folder pointed at the
    same store, calls no worker, encodes no prompt, rebuilds the same matrix (same data_version)
    and routes with A's promoted router."""
    if os.environ.get("FUGU_SCALE_DEMO") != "1":  # S3 itself runs in CI through the tests above
        pytest.skip("two full pipelines through a loopback S3 (~1 min quiet, ~3 min loaded): runs with FUGU_SCALE_DEMO=1")
    import duckdb

    from fugu_pipeline_tests.scale_project import make_project, project_env
    from fugu_pipeline_tests.services import VENV_BIN, split_sample

    env = {**_store_env(s3.url), "FUGU_DATA_URL": f"s3://{BUCKET}/pipeline/data", "FUGU_MODELS_URL": f"s3://{BUCKET}/pipeline/models"}
    outs, versions, cells = {}, {}, {}
    for name in ("machine-a", "machine-b"):
        project = make_project(tmp_path / name, REPO / "dagster.yaml")
        split_sample(project, {"sample": 90})
        e = project_env(project, {**env, "FUGU_STORE_CACHE": str(tmp_path / name / "cache")})
        args = [str(VENV_BIN / "fugu-lite"), "pipeline", "--encoder", "tiny", "--workers", "configs/workers.slow.yaml"]
        if name == "machine-b":
            args += ["--stop-after", "task_embeddings"]
        out = subprocess.run(args, cwd=project, env=e, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        outs[name] = out.stdout
        con = duckdb.connect(str(project / "data" / "reward_matrix.duckdb"), read_only=True)
        versions[name] = con.execute("SELECT value FROM meta WHERE key = 'data_version'").fetchone()[0]
        cells[name] = con.execute("SELECT count(*) FROM rewards").fetchone()[0]
        con.close()
    b = outs["machine-b"]
    print(b)
    assert all("called 0," in line for line in b.splitlines() if line.strip().startswith("responses["))
    assert "embeddings: 0 encoded" in b
    assert versions["machine-a"] == versions["machine-b"] and cells["machine-a"] == cells["machine-b"] == 270
    assert "promotion: promoted" in outs["machine-a"], outs["machine-a"][-1500:]
    route = subprocess.run([sys.executable, "-c", MACHINE_B, env["FUGU_MODELS_URL"]], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, **env, "FUGU_STORE_CACHE": str(tmp_path / "machine-c")}, timeout=300)
    assert route.returncode == 0, route.stderr[-2000:]
    pointer = json.loads(store.get_bytes(f"{env['FUGU_MODELS_URL']}/promoted/current.json"))
    got = json.loads(route.stdout.strip().splitlines()[-1])
    assert got["content_hash"] == pointer["content_hash"]
    assert {"head.safetensors", "manifest.json", "budget.json"} <= set(got["files"]), got["files"]  # the whole folder


def test_files_written_beside_a_pushed_checkpoint_reach_the_store_and_the_weights_go_once(tmp_path):
    """A checkpoint is pushed when it is trained; `policy.json` and `budget.json` are written beside
    it later (by the cascade step, by `evaluate`). Each push sends what is new or changed, never the
    content-addressed weights again, and a machine that pulls the folder gets all of it, manifest last."""
    from fugu_pipeline.storage import download_dir, sync_checkpoint

    local, url = tmp_path / "models" / "sft" / "abc", str(tmp_path / "store" / "sft" / "abc")
    local.mkdir(parents=True)
    (local / "head.safetensors").write_bytes(b"weights")
    (local / "manifest.json").write_text('{"content_hash": "abc"}')
    assert sync_checkpoint(local, url, last="manifest.json") == 2
    assert sync_checkpoint(local, url, last="manifest.json") == 0
    (local / "policy.json").write_text('{"line": "first"}')
    assert sync_checkpoint(local, url, last="manifest.json") == 1
    (local / "policy.json").write_text('{"line": "second"}')
    (local / "head.safetensors").write_bytes(b"not sent: the folder is content-addressed")
    (local / "reports").mkdir()
    (local / "reports" / "test.json").write_text("{}")  # evaluate's report folder stays on this machine
    assert sync_checkpoint(local, url, last="manifest.json") == 1
    got = download_dir(url, tmp_path / "machine-b", last="manifest.json")
    assert got == ["head.safetensors", "policy.json", "manifest.json"]
    assert (tmp_path / "machine-b" / "policy.json").read_text() == '{"line": "second"}'
    assert (tmp_path / "machine-b" / "head.safetensors").read_bytes() == b"weights"
    (local / "policy.json").unlink()  # a cascade ships instead: the heads' description is gone here...
    assert sync_checkpoint(local, url, last="manifest.json") == 1
    again = download_dir(url, tmp_path / "machine-c", last="manifest.json")
    assert again == ["head.safetensors", "manifest.json"]  # ...and from the store
