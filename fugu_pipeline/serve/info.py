"""The read-only endpoints of the server: `GET /v1/models` (the router's entry names the checkpoint
served and the policy `train` chose for it), `GET /v1/models/{id}` and `GET /health`
(no token needed; the checkpoint's path, the text of a load or reload error and why a worker is
kept out only with the token, when one is set).

`/health` holds: `status`, `uptime_s`, the `checkpoint` (tag, content hash, method, worker ids, and
the `policy` `fugu-lite train` chose and printed for it, `route/shipped.py`),
`reload_error`, every configured worker with `kept_out` (null, or the HTTP status that put it out,
`seconds_left` and `until`: it is in a cooldown and not called until then, `workers/health.py`),
its `health` (state, consecutive failures, cooldowns so far) and `limits` (tools, context window,
output limit: `workers/limits.py`),
the ids of the workers kept out now (`kept_out`), the request `limits` (`max_body_bytes`,
`max_json_values`, `auth_cooldown_s`), the routing micro-batcher's figures and request counts."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fugu_pipeline.serve.protocol import APIError
from fugu_pipeline.serve.source import checkpoint_tag


ROUTER_MODEL = "fugu-lite"


async def _current_router(svc):
    """The router served now (loaded or reloaded off the event loop); raises what loading raised."""
    def current() -> object:
        with svc.source.lock:
            return svc.source.get()

    return await asyncio.to_thread(current)


async def _router_facts(svc) -> dict:
    """What the router model entry says of the checkpoint served: its tag and the policy `train`
    chose for it (`route/shipped.py`; null without a description); {} while none is loaded."""
    if svc.source.absent:
        return {}
    try:
        router = await _current_router(svc)
    except Exception:  # the reason is /health's to give (with the token)
        return {}
    return {"checkpoint": checkpoint_tag(router), "policy": _router_policy(router)}


def _router_policy(router) -> dict | None:
    """What train chose and printed for the checkpoint (`route/shipped.py`); None without a description."""
    shipped = getattr(router, "shipped", None)
    return shipped.public() if shipped is not None else None


async def _model_list(svc) -> list[dict]:  # svc: serve.app.Service (not imported: app imports this module)
    created = int(svc.started_wall)
    data = [{"id": ROUTER_MODEL, "object": "model", "created": created, "owned_by": "fugu-lite",
             **(await _router_facts(svc))}]
    for w in svc.workers.config.workers:
        data.append({"id": w.id, "object": "model", "created": created, "owned_by": w.kind,
                     "upstream_model": getattr(w, "model", None)})
    return data


async def list_models(request: Request) -> Response:
    svc = request.app.state.fugu
    svc.check_auth(request)
    return JSONResponse({"object": "list", "data": await _model_list(svc)})


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{id}` (the client's `models.retrieve`)."""
    svc = request.app.state.fugu
    svc.check_auth(request)
    wanted = request.path_params["model_id"]
    found = next((m for m in await _model_list(svc) if m["id"] == wanted), None)
    if found is None:
        raise APIError(404, f"model {wanted[:80]!r} not found; GET /v1/models lists them", param="model",
                       code="model_not_found", type="invalid_request_error")
    return JSONResponse(found)


def _health(svc, wid: str, trusted: bool) -> dict:
    """A worker's health (`workers/health.py`); the upstream's error text only with the token."""
    h = svc.workers.tracker.state(wid)
    return h if trusted else {k: v for k, v in h.items() if k != "reason"}


def _limits(svc, wid: str) -> dict:
    lim = svc.workers.limits[wid]
    return {"supports_tools": lim.supports_tools, "context_window": lim.context_window,
            "max_output_tokens": lim.max_output_tokens}


async def health(request: Request) -> Response:
    svc = request.app.state.fugu
    if svc.stopping:
        return JSONResponse({"status": "shutting_down", "error": svc.shutdown_message(),
                             "uptime_s": round(time.monotonic() - svc.started, 3)}, status_code=503)
    try:  # without the token (when one is set), no filesystem path or error text: /health needs no token
        svc.check_auth(request)
        trusted = True
    except APIError:
        trusted = False
    if svc.source.absent:  # a coordinator alone is served
        return JSONResponse({"status": "ok", "uptime_s": round(time.monotonic() - svc.started, 3), "checkpoint": None,
                             "one_step_router": svc.source.absent, "counts": dict(svc.counts),
                             "workers": [{"id": w.id, "kind": w.kind, "model": getattr(w, "model", None)}
                                         for w in svc.workers.config.workers]})
    try:
        router = await _current_router(svc)
    except Exception as exc:
        error = f"no router could be loaded: {type(exc).__name__}: {exc}" if trusted else (
            "no router could be loaded (send the server's bearer token for the reason)")
        return JSONResponse({"status": "error", "error": error,
                             "uptime_s": round(time.monotonic() - svc.started, 3)}, status_code=503)
    m = router.checkpoint.manifest
    reload_error = svc.source.reload_error
    return JSONResponse({
        "status": "ok",
        "uptime_s": round(time.monotonic() - svc.started, 3),
        "checkpoint": {**({"path": router.path} if trusted else {}), "tag": checkpoint_tag(router),
                       "content_hash": m.content_hash, "method": m.method, "worker_ids": router.worker_ids,
                       # what train chose and printed (route/shipped.py); null when it wrote no description
                       "policy": _router_policy(router),
                       # the run's checkpoints a cap this one cannot keep goes to (policies/registry.attach_cap_routers)
                       **({"cap_checkpoints": {"loaded": sorted(getattr(router, "cap_routers", {})),
                                               "not_loaded": {t: (why if trusted else "send the server's bearer token "
                                                                  "for the reason") for t, why in
                                                              sorted(getattr(router, "cap_problems", {}).items())}}}
                          if getattr(router, "cap_routers", None) or getattr(router, "cap_problems", None) else {})},
        "reload_error": reload_error if trusted or reload_error is None else (
            "the last reload failed (send the server's bearer token for the reason)"),
        "workers": [{"id": w.id, "kind": w.kind, "model": getattr(w, "model", None),
                     "routed": any(i in router.worker_ids for i in (w.id, *w.aliases)), **({"aliases": w.aliases} if w.aliases else {}),
                     "kept_out": svc.workers.kept_out_info(w.id, detail=trusted),
                     "health": _health(svc, w.id, trusted), "limits": _limits(svc, w.id)}
                    for w in svc.workers.config.workers],
        "kept_out": sorted(w for w in svc.workers.specs if svc.workers.kept_out_error(w) is not None),
        "limits": {"max_body_bytes": svc.max_body_bytes, "max_json_values": svc.max_json_values,
                   "auth_cooldown_s": svc.workers.cooldown_s},
        "batching": svc.batcher.stats(),
        "counts": dict(svc.counts),
    })
