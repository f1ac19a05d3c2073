"""The OpenAI SDK's tool round trip against `fugu-lite serve` on loopback, printed as a transcript.

    .venv/bin/python scripts/tool_round_trip.py

Trains a small router on the tiny encoder (in a temporary folder), starts the stub LLM workers on
127.0.0.1 (`alpha`, `beta`, `gamma`; only `beta` has `supports_tools: true`) and the server, then
runs the round trip (`fugu_pipeline/testing/tool_round_trip.py`) plain, and streamed with two tool
calls at once, and prints what the upstream received.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import openai

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import WORKERS, ServerThread, build_checkpoints, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.testing.tool_round_trip import ARGUMENTS, TOOLS, round_trip


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, StubLLMServer() as stub:
        build_checkpoints(Path(tmp), seeds=(0,))
        config = stub_workers_config(stub.openai_url)
        config = config.model_copy(update={"workers": [w.model_copy(update={"supports_tools": w.id == "beta"})
                                                       for w in config.workers]})
        for name, args in ARGUMENTS.items():
            stub.set_tool_arguments(name, args)
        srv = ServerThread(create_app(PromotedRouter(Path(tmp), device="cpu"), config))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
            print(f"workers: {list(WORKERS)}; supports_tools: beta only")
            for stream, parallel in ((False, 1), (True, 2)):
                stub.parallel_tools = parallel
                stub.reset_counts()
                round_trip(client, stream=stream, say=print)
                for k, req in enumerate(stub.chat_requests()):
                    body = req.body or {}
                    print(f"    upstream request {k + 1} ({body.get('model')}): tools unchanged: "
                          f"{body.get('tools') == TOOLS}; messages: "
                          f"{[(m['role'], m.get('tool_call_id') or len(m.get('tool_calls') or [])) for m in body['messages']]}")
                print()
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
