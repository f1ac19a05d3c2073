"""`fugu-lite serve`: load the router and the workers, then serve with uvicorn until interrupted."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fugu_pipeline.serve.app import (
    DEFAULT_BATCH_WINDOW_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    checkpoint_tag,
    create_app,
    load_router_provider,
)
from fugu_pipeline.train.pointer import ROLES_POINTER

log = logging.getLogger("fugu_pipeline.serve")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(
    checkpoint_or_models_dir: str | Path,
    workers_config_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    api_token: str | None = None,
    device: str = "auto",
    encoder: str | None = None,
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    worker_attempts: int | None = 1,
    torch_threads: int | None = None,
    log_level: str = "info",
) -> None:
    """Load the router and workers, then serve until interrupted. The token is `api_token`, else
    `$FUGU_SERVE_TOKEN`; API keys for workers come from the environment or a `.env` file.
    `torch_threads` caps torch's CPU threads for the encoder (None: torch's default); on a CPU
    shared with other work, 1 avoids threads spinning against each other."""
    import uvicorn

    from fugu_pipeline.api_keys import load_env_file

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_env_file()
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    token = api_token if api_token is not None else (os.environ.get("FUGU_SERVE_TOKEN") or None)
    if token is None and host not in LOOPBACK:
        log.warning("serving on %s without a token: set FUGU_SERVE_TOKEN (or --token), and put TLS in front", host)
    provider = load_router_provider(checkpoint_or_models_dir, device=device, encoder=encoder)
    roles = None  # "fugu_mode": "multi_turn" requests: the promoted coordinator, when the models folder has one
    if (Path(checkpoint_or_models_dir) / ROLES_POINTER).exists():
        from fugu_pipeline.route.roles import PromotedRoles

        roles = PromotedRoles(checkpoint_or_models_dir, device=device, encoder=encoder)
    app = create_app(provider, workers_config_path, api_token=token, max_body_bytes=max_body_bytes,
                     batch_window_ms=batch_window_ms, max_batch=max_batch, worker_attempts=worker_attempts, roles=roles)
    router = app.state.fugu.source.last
    log.info("fugu-lite serving %s (%s) on http://%s:%d/v1", checkpoint_tag(router), router.path, host, port)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
