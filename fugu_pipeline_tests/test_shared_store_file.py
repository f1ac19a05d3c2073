"""The shared store as a `file://` folder (an NFS mount): the same pull and push as S3, no service."""

from __future__ import annotations

from pathlib import Path

from fugu_pipeline.defs.shared import SharedStore
from fugu_pipeline.paths import ProjectPaths


def test_a_file_store_shares_every_partition_file(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "nfs" / "data"
    monkeypatch.setenv("FUGU_DATA_URL", f"file://{shared}")
    a, b = ProjectPaths(tmp_path / "machine-a"), ProjectPaths(tmp_path / "machine-b")
    for batch, worker in (("b1", "alpha"), ("b1", "beta"), ("b2", "alpha")):
        f = a.responses / batch / f"{worker}.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f'{{"task_id": "{batch}-t1", "worker_id": "{worker}"}}\n')
        assert SharedStore.of(a).push_responses(batch, worker)
    store_b = SharedStore.of(b)
    assert store_b.pull_all_responses() == 3  # every batch folder listed through the file:// URL
    assert (b.responses / "b2" / "alpha.jsonl").read_text() == (a.responses / "b2" / "alpha.jsonl").read_text()
    assert store_b.pull_all_responses() == 0  # unchanged files are not fetched again
