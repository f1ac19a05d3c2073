"""`fugu-lite serve`: load the router and the workers, then serve with uvicorn until interrupted.

What is served (`providers`): a models folder gives the promoted one-step router and the promoted
multi-turn coordinator, whichever it holds (a coordinator alone is enough: one-step requests then
get a 400 naming what is missing); a checkpoint gives that router, or that coordinator when it is
a roles checkpoint.

CPU threads. Serving encodes small batches (a few prompts of a few hundred tokens); splitting
such a batch over torch's default of one thread per core mostly buys threads spinning while they
wait for each other, next to the event loop and the worker loop that need the same cores. Measured
on a 2-core machine with the tiny encoder: 16-32 ms of CPU per request with torch's default
threads, 5.5-6.5 ms with one. So serving defaults to `torch_threads=1`; raise it for a large
encoder on a CPU with idle cores (it shortens one big forward pass), 0 keeps torch's default.

Shutdown (SIGTERM, SIGINT). uvicorn stops accepting connections and waits for the replies in
flight; the app is told when that begins (`Service.begin_shutdown`), so it answers new requests
with a 503 and gives replies in flight `shutdown_grace_s` to finish. A reply still running then
ends with a `server_shutting_down` error (a stream: an error event before `[DONE]`, never a stream
that simply stops) and its worker call is closed. uvicorn's own deadline, after which it cancels
whatever still runs, comes `SHUTDOWN_MARGIN_S` later.

Connections (`connections.py`). uvicorn serves with its own HTTP protocol wrapped in a guard:
header and body read timeouts, the idle keep-alive limit, a cap on open connections that closes
the oldest idle or half-open one first (within what the open-file limit leaves), and the app's
cap on requests in flight; the log line at start says the limits.
"""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path

from fugu_pipeline.serve.app import (
    DEFAULT_BATCH_WINDOW_MS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_BYTES,
    checkpoint_tag,
    create_app,
    load_router_provider,
)
from fugu_pipeline.serve.connections import ConnectionLimits, connection_cap, uvicorn_options
from fugu_pipeline.serve.json_body import DEFAULT_MAX_JSON_VALUES
from fugu_pipeline.serve.upstream import DEFAULT_AUTH_COOLDOWN_S, project_catalog
from fugu_pipeline.route.router import RouterError
from fugu_pipeline.settings import settings
from fugu_pipeline.workers.config import load_workers_config

log = logging.getLogger("fugu_pipeline.serve")
DEFAULT_TORCH_THREADS = 1
DEFAULT_SHUTDOWN_GRACE_S = 5.0
SHUTDOWN_MARGIN_S = 2.0  # for the replies cut at the grace period's end to write their error and close
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def providers(checkpoint_or_models_dir: str | Path, *, device: str = "auto", dtype: str = "auto",
              encoder: str | None = None):
    """(one-step router provider or None, coordinator or None, why there is no one-step router).
    A models folder gives the promoted router and the promoted coordinator, whichever it has; a
    checkpoint gives a fixed router, or a fixed coordinator when it is a roles checkpoint. At least
    one of the two, else RouterError naming both pointers."""
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE, Manifest
    from fugu_pipeline.train.pointer import POINTER, ROLES_POINTER

    path = Path(checkpoint_or_models_dir)
    opts = {"device": device, "dtype": dtype, "encoder": encoder}
    if (path / MANIFEST_FILE).exists():
        try:
            kind = Manifest.model_validate_json((path / MANIFEST_FILE).read_bytes()).head_kind
        except (OSError, ValueError):
            kind = ""
        if kind.startswith("roles"):
            from fugu_pipeline.policies.coordinator.route import RolesCoordinator

            return None, RolesCoordinator.load(path, **opts), (
                f"this server runs the multi-turn coordinator {path} only, no one-step router: send "
                '"fugu_mode": "multi_turn", or start it with a one-step checkpoint or a models folder')
    if (path / POINTER).exists() or (path / MANIFEST_FILE).exists() or path.is_file():
        provider = load_router_provider(path, **opts)
    elif (path / ROLES_POINTER).exists():
        provider = None
    else:
        raise RouterError(f"{path} is neither a checkpoint directory (manifest.json + head.safetensors) nor a models "
                          f"directory with {POINTER} or {ROLES_POINTER}; pass a trained checkpoint or the models directory")
    roles = None
    if (path / ROLES_POINTER).exists():
        from fugu_pipeline.policies.coordinator.route import PromotedRoles

        roles = PromotedRoles(path, **opts)
    absent = None if provider is not None else (
        f"no one-step router is promoted in {path} ({POINTER} is missing), only a multi-turn coordinator: send "
        '"fugu_mode": "multi_turn", or promote a router (fugu-lite pipeline) and restart')
    return provider, roles, absent


class PortUnavailable(RuntimeError):
    """The address to serve on cannot be bound; the message names it and what to do."""


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on (host, port), bound as uvicorn binds one, or `PortUnavailable`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = f"port {port} on {host} is in use (another server, or an earlier `fugu-lite serve` still running)"
            fix = f"stop what holds it, or serve on another port{_free_port_near(host, family, port)}"
        elif exc.errno == errno.EACCES:
            why = f"port {port} on {host} needs privileges this process lacks"
            fix = "serve on a port above 1023, e.g. --port 8080"
        else:
            why = f"cannot serve on {host}:{port} ({exc.strerror or exc})"
            fix = "check --host (an address of this machine, e.g. 127.0.0.1 or 0.0.0.0) and --port"
        raise PortUnavailable(f"{why}; nothing was served. {fix[0].upper()}{fix[1:]}") from None
    return sock


def _free_port_near(host: str, family: int, port: int) -> str:
    """`, e.g. --port N` for the first of the next few ports that is free now, else nothing."""
    for candidate in range(port + 1, min(port + 21, 65536)):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
            return f", e.g. --port {candidate}"
    return ""


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
    torch_threads: int | None = DEFAULT_TORCH_THREADS,
    dtype: str = "auto",
    log_level: str = "info",
    default_budget=None,
    default_point: bool = True,
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
    max_json_values: int = DEFAULT_MAX_JSON_VALUES,
    allowed_hosts: tuple[str, ...] = (),
    auth_cooldown_s: float = DEFAULT_AUTH_COOLDOWN_S,
    limits: ConnectionLimits | None = None,
) -> None:
    """Load the router and workers, then serve until interrupted. The token is `api_token`, else
    `$FUGU_SERVE_TOKEN`; API keys for workers come from the environment or a `.env` file.
    `torch_threads`: torch's CPU threads for the encoder (default 1, see the module docstring;
    0 or None: torch's default). `dtype`: the encoder's, `auto` by the same rule as the embedding
    step (bf16 on GPUs and on CPUs with native bf16, else fp32), so serving computes the features
    the checkpoint was trained on when both ran on the same kind of machine. `shutdown_grace_s`: how
    long replies in flight get to finish once shutdown begins (see the module docstring).
    `max_json_values`: the request bodies' value limit (`json_body.py`); `allowed_hosts`: names
    answered besides the bound address's (`hosts.py`); `auth_cooldown_s`: how long a worker whose
    key is refused is kept out (`upstream.py`); `limits`: timeouts and caps on connections and
    requests in flight (`connections.py`, default `ConnectionLimits()`)."""
    import uvicorn

    from fugu_pipeline.api_keys import load_env_file

    if shutdown_grace_s < 0:
        raise ValueError(f"shutdown_grace_s must be >= 0, got {shutdown_grace_s}")
    limits = limits or ConnectionLimits()

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_workers_config(workers_config_path)  # a missing or broken worker file is said before anything loads
    load_env_file()
    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    env_token = settings().serve_token
    token = (api_token if api_token is not None else env_token and env_token.get_secret_value()) or None  # "" is no token
    if token is None and host not in LOOPBACK:
        log.warning("serving on %s without a token: set FUGU_SERVE_TOKEN (or --token), and put TLS in front", host)
    # the one-step router and the multi-turn coordinator ("fugu_mode": "multi_turn"), whichever the path gives
    provider, roles, absent = providers(checkpoint_or_models_dir, device=device, dtype=dtype, encoder=encoder)
    if provider is None and default_budget is not None:
        raise RouterError("--budget-*: a default cap applies to one-step routing, and this server has no one-step router")
    app = create_app(provider, workers_config_path, api_token=token, max_body_bytes=max_body_bytes,
                     batch_window_ms=batch_window_ms, max_batch=max_batch, worker_attempts=worker_attempts,
                     default_budget=default_budget, default_point=default_point, roles=roles, absent=absent, max_json_values=max_json_values,
                     bind_host=host, allowed_hosts=allowed_hosts, auth_cooldown_s=auth_cooldown_s,
                     catalog=project_catalog(), limits=limits)
    cap, cap_why = connection_cap(limits)  # after loading: the descriptors the model holds are counted
    sock = bind(host, port)  # before the server is announced: a taken port is said, and nothing is served
    port = sock.getsockname()[1]
    router = app.state.fugu.source.last
    hosts = app.state.fugu_hosts.describe()
    if router is None:
        log.info("fugu-lite serving the multi-turn coordinator %s only on http://%s:%d/v1 (%s); answers the host names %s",
                 getattr(roles, "tag", None) or Path(checkpoint_or_models_dir), host, port, absent, hosts)
    else:
        log.info("fugu-lite serving %s (%s) on http://%s:%d/v1", checkpoint_tag(router), router.path, host, port)
        log.info("%s; torch threads %d; auth %s; answers the host names %s", router.encoder.describe(),
                 torch.get_num_threads(), "bearer token" if token else "none", hosts)
    log.info("connections: %s; headers within %g s, bodies within %g s of them, idle keep-alive %g s; at most %d "
             "requests in flight (503 with Retry-After beyond)", cap_why, limits.header_timeout_s, limits.body_timeout_s,
             limits.keep_alive_s, limits.max_in_flight)
    if router is not None and getattr(router, "shipped", None) is not None:
        log.info("%s", router.shipped.describe())
    elif router is not None and getattr(router, "shipped_problem", ""):
        log.warning("%s", router.shipped_problem)
    if default_budget is None and router is not None and default_point and getattr(router, "default_point", None):
        log.info("requests without a cap: %s; %s", router.default_point.describe(), router.default_point.reason)
    if default_budget is not None:
        sent = router.cap_router(default_budget)  # a cap the shipped description sends to another checkpoint of the run
        if sent is not None:
            log.info("default %s: served by %s (%s)", default_budget.describe(), sent[0].tag, sent[1]["why"])
        by = sent[0] if sent is not None else router
        p = by.own_budget_point(default_budget)
        if hasattr(p, "lam"):  # a one-step head's λ; a cascade's is a saved plan
            log.info("default %s: λ=%.4g chosen on the calibration's %s (share there %.4f of %s%s); requests route at a "
                     "λ following the cap's spend from the cap's target",
                     default_budget.describe(), p.lam, by.calibration.rows_text(), p.val_share,
                     by.calibration.reference_worker, "" if p.met_on_validation else "; NOT met")
        else:
            log.info("default %s: %s", default_budget.describe(), p[0].describe())
    class GracefulServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            app.state.fugu.begin_shutdown(shutdown_grace_s)  # tell the app first, see the module docstring
            await super().shutdown(sockets)

    server = GracefulServer(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=shutdown_grace_s + SHUTDOWN_MARGIN_S,
                                           **uvicorn_options(app, limits, cap)))
    try:
        with sock:
            server.run(sockets=[sock])
    except KeyboardInterrupt:  # SIGINT, raised again by uvicorn once it has shut down
        pass
    if not server.started:
        raise SystemExit(3)  # as uvicorn.run: the server could not start (its startup failed)
