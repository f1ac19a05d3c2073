"""`make_client`: the client for one worker spec (mock, or an HTTP client imported only when needed)."""

from __future__ import annotations

from fugu_pipeline.workers.config import WorkersConfig, WorkerSpec
from fugu_pipeline.workers.contract import WorkerClient
from fugu_pipeline.workers.mock import MockClient, MockJudge


def make_client(spec: WorkerSpec, config: WorkersConfig, *, judge: bool = False, catalog=None) -> WorkerClient:
    """The client for one worker spec. Real HTTP clients are imported only when needed."""
    if spec.kind == "mock":
        return MockJudge(spec) if judge else MockClient(spec)
    from fugu_pipeline.workers.http import make_http_client

    return make_http_client(spec, config, catalog=catalog)
