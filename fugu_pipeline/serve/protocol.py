"""The Chat Completions protocol as this server speaks it: parsing and validating a request body,
and errors in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

Hostile input is refused here, at the boundary, with a 4xx naming what is wrong, before it can
reach the router or a worker: a body not sent as `application/json` (415), over the size limit
or holding more JSON values than the value limit (413), not strict JSON (NaN, Infinity, numbers
out of float range or int64), nested deeper than `MAX_JSON_DEPTH`, holding text that is not valid
Unicode (a lone UTF-16 surrogate such as `"\ud800"`: it cannot be encoded as UTF-8, so neither
the tokenizer nor a worker could take it), or fields of the wrong type (400). The JSON rules and
limits are in `json_body.py`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fugu_pipeline.cost_cap import KEYS as CAP_KEYS
from fugu_pipeline.cost_cap import CapError, CostCap
from fugu_pipeline.route.router import MAX_COST_WEIGHT
from fugu_pipeline.serve import json_body
from fugu_pipeline.serve.json_body import DEFAULT_MAX_JSON_VALUES
from fugu_pipeline.serve.json_body import MAX_JSON_DEPTH as MAX_JSON_DEPTH  # where callers look for it
from fugu_pipeline.serve.tool_calls import BadField, check_tool_messages, check_tools
from fugu_pipeline.tasks.messages import routed_text
from fugu_pipeline.workers.limits import CONTEXT_EXCEEDED, prompt_tokens_estimate

log = logging.getLogger("fugu_pipeline.serve")

DEFAULT_MAX_BODY_BYTES = 2 << 20
MODES = ("one_step", "multi_turn")  # `fugu_mode`: the one-step router, or the multi-turn coordinator

_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
           "frequency_penalty": (-2.0, 2.0)}
_INTS = {"max_tokens": 1, "max_completion_tokens": 1, "seed": None}  # name -> minimum
_TYPED = {"user": (str,), "reasoning_effort": (str,)}
_FUGU_KEYS = {"allowed_workers", "cost_weight", "domain", "budget"}
_BUDGET_KEYS = set(CAP_KEYS)


class APIError(Exception):
    """An error answered to the client in the OpenAI shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, extra: dict | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.extra, self.headers = extra or {}, headers


class RouterUnavailable(RuntimeError):
    """No router could be loaded for this batch."""


def error_response(exc: APIError) -> JSONResponse:
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}, **exc.extra}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    return error_response(exc)  # type: ignore[arg-type]


async def http_error_handler(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    code = {404: "not_found", 405: "method_not_allowed"}.get(status)
    return error_response(APIError(status, f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}",
                                   code=code, headers=getattr(exc, "headers", None)))


async def server_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(APIError(500, f"internal server error: {type(exc).__name__}", type="server_error",
                                   code="internal_error"))


@dataclass
class ChatRequest:
    messages: list[dict]
    text: str  # what is routed: the last user message
    stream: bool = False
    include_usage: bool = False
    params: dict = field(default_factory=dict)
    domain: str | None = None
    allowed: tuple[str, ...] | None = None
    cost_weight: float | None = None
    budget: CostCap | None = None
    billed_text: str = ""  # every message's text: what the worker is billed for (the budget's expected cost)
    ignored: list[str] = field(default_factory=list)  # fields that have no effect, each with why
    mode: str = "one_step"  # `fugu_mode`: "multi_turn" goes to the coordinator (`multi_turn.py`)
    max_usd: float | None = None  # `fugu_max_usd`: a multi-turn session's own spend cap (USD)
    uses_tools: bool = False  # `tools` or tool messages: served one-step by workers with supports_tools
    prompt_tokens: int = 0  # the messages' and tools' tokens, estimated (`workers/limits.py`)


_TOOL_PARAMS = ("tools", "tool_choice", "parallel_tool_calls")  # passed to the worker as sent (`tool_calls.py`)
_HANDLED = {"messages", "model", "stream", "stream_options", "n", *_TOOL_PARAMS, "functions", "function_call", "fugu_lite",
            "fugu_allowed_workers", "fugu_cost_weight", "fugu_budget", "fugu_mode", "fugu_max_usd", "domain"}


def ignored_fields(body: dict) -> list[str]:
    """The request fields this server neither uses nor passes on, each with why: a client that
    sends them learns so instead of believing they took effect."""
    out = []
    model = body.get("model")
    if model is not None and model != "fugu-lite":
        out.append(f"model: {model[:60]!r} does not pick the worker; the router does (send \"fugu-lite\")")
    known = _HANDLED | set(_RANGES) | set(_INTS) | set(_TYPED) | set(_CHECKED)
    for name in sorted(set(body) - known):
        if body[name] is not None:
            out.append(f"{name[:60]}: not supported by fugu-lite; not sent to the worker")
    return out[:20]


def _is_num(v: Any) -> bool:
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an int beyond float range
        return False


def require_json(request: Request) -> None:
    """415 unless the body is declared `application/json` (UTF-8). A web page can post a plain
    form (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`) to any server
    without asking first; it cannot send `application/json` cross-site without a CORS preflight,
    which this server does not answer."""
    declared = request.headers.get("content-type", "")
    media, _, params = declared.partition(";")
    charset = next((v.strip().strip('"').lower() for k, _, v in (p.partition("=") for p in params.split(";"))
                    if k.strip().lower() == "charset"), "utf-8")
    if media.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
        raise APIError(415, f"unsupported Content-Type {declared or '(none)'!r}: send the body as JSON with "
                       "'Content-Type: application/json'", code="unsupported_media_type")


def load_json(raw: bytes, max_values: int = DEFAULT_MAX_JSON_VALUES) -> Any:
    """The body as strict JSON within the limits (`json_body.py`); APIError (400 / 413) otherwise."""
    try:
        return json_body.load_json(raw, max_values)
    except json_body.BodyError as exc:
        raise APIError(exc.status, exc.message, param=exc.param, code=exc.code) from None


def _check_parts(i: int, content: list) -> None:
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type", "text"), str):
            raise APIError(400, f"{where} must be an object with a string 'type'", param=where, code="invalid_type")
        if part.get("type", "text") == "text" and not isinstance(part.get("text"), str):
            raise APIError(400, f"{where} is a text part without a string 'text'", param=where, code="invalid_type")


def _check_stop(v: Any) -> None:
    if isinstance(v, str) or (isinstance(v, list) and 0 < len(v) <= 4 and all(isinstance(x, str) for x in v)):
        return
    raise APIError(400, "'stop' must be a string or a list of up to 4 strings", param="stop", code="invalid_type")


def _check_logit_bias(v: Any) -> None:
    if isinstance(v, dict) and all(_is_num(b) and -100 <= b <= 100 for b in v.values()):
        return
    raise APIError(400, "'logit_bias' must map token ids to numbers in [-100, 100]", param="logit_bias",
                   code="invalid_value")


def _check_response_format(v: Any) -> None:
    if isinstance(v, dict) and isinstance(v.get("type"), str):
        return
    raise APIError(400, "'response_format' must be an object with a string 'type'", param="response_format",
                   code="invalid_type")


_CHECKED = {"stop": _check_stop, "logit_bias": _check_logit_bias, "response_format": _check_response_format}


def parse_chat_request(raw: bytes, max_values: int = DEFAULT_MAX_JSON_VALUES) -> ChatRequest:
    """Validate a chat-completions body; raises APIError (400, or 413 past the value limit) naming
    the bad parameter. Bounded work whatever the body (`json_body.py`), so the app may run it
    outside the serving loop."""
    body = load_json(raw, max_values)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise APIError(400, "'model' must be a string (send \"fugu-lite\")", param="model", code="invalid_type")
    msgs = body.get("messages")
    if msgs is None:
        raise APIError(400, "missing required parameter: 'messages'", param="messages", code="missing_required_parameter")
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages",
                       code="invalid_value")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]",
                           code="invalid_value")
        if m.get("content") is not None and not isinstance(m["content"], (str, list)):
            raise APIError(400, f"messages[{i}].content must be a string or a list of content parts",
                           param=f"messages[{i}].content", code="invalid_value")
        if isinstance(m.get("content"), list):
            _check_parts(i, m["content"])
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise APIError(400, f"messages[{i}].name must be a string", param=f"messages[{i}].name", code="invalid_type")
    n = body.get("n")
    if n is not None and n != 1:
        raise APIError(400, f"n={n!r} is not supported: fugu-lite returns exactly one choice (n=1)", param="n",
                       code="unsupported_value")
    try:
        check_tools(body)
        uses_tools = check_tool_messages(msgs) or body.get("tools") is not None
    except BadField as exc:
        raise APIError(400, exc.message, param=exc.param, code=exc.code) from None
    mode = body.get("fugu_mode")
    if mode is not None and mode not in MODES:
        raise APIError(400, f"'fugu_mode' must be one of {list(MODES)}, got {repr(mode)[:80]}", param="fugu_mode",
                       code="invalid_value")
    max_usd = body.get("fugu_max_usd")
    if max_usd is not None and (not _is_num(max_usd) or max_usd <= 0):
        raise APIError(400, f"'fugu_max_usd' must be a number > 0 (USD this session may spend), got {repr(max_usd)[:40]}",
                       param="fugu_max_usd", code="invalid_value")
    ignored = ignored_fields(body)
    if mode == "multi_turn" and uses_tools:
        ignored.append("fugu_mode: a request with tools is served one-step by a worker that supports tools (the "
                       "coordinator's turns exchange text answers, not tool calls)")
        mode = "one_step"
    if max_usd is not None and (mode or "one_step") == "one_step":
        ignored.append("fugu_max_usd: caps a multi-turn session's spend; a one-step request is capped by fugu_budget")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise APIError(400, "'stream' must be true or false", param="stream", code="invalid_type")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise APIError(400, "'stream_options' must be an object like {\"include_usage\": true}",
                       param="stream_options", code="invalid_type")

    fugu = body.get("fugu_lite") or {}
    if not isinstance(fugu, dict) or set(fugu) - _FUGU_KEYS:
        raise APIError(400, f"'fugu_lite' must be an object with keys among {sorted(_FUGU_KEYS)}", param="fugu_lite",
                       code="invalid_value")
    top = lambda name, key: body[name] if body.get(name) is not None else fugu.get(key)  # noqa: E731
    allowed = top("fugu_allowed_workers", "allowed_workers")
    if allowed is not None and (not isinstance(allowed, list) or not allowed or not all(isinstance(w, str) for w in allowed)):
        raise APIError(400, "'fugu_allowed_workers' must be a non-empty list of worker ids", param="fugu_allowed_workers",
                       code="invalid_value")
    cost_weight = top("fugu_cost_weight", "cost_weight")
    if cost_weight is not None and (not _is_num(cost_weight) or not 0 <= cost_weight <= MAX_COST_WEIGHT):
        raise APIError(400, f"'fugu_cost_weight' must be a number in [0, {MAX_COST_WEIGHT:g}]", param="fugu_cost_weight",
                       code="invalid_value")
    budget = parse_budget(top("fugu_budget", "budget"))
    if budget is not None and cost_weight is not None:
        raise APIError(400, "send 'fugu_budget' or 'fugu_cost_weight', not both", param="fugu_budget", code="invalid_value")
    domain = top("domain", "domain")
    if domain is not None and not isinstance(domain, str):
        raise APIError(400, "'domain' must be a string", param="domain", code="invalid_type")

    params: dict = {k: body[k] for k in _TOOL_PARAMS if body.get(k) is not None}
    for name, (lo, hi) in _RANGES.items():
        v = body.get(name)
        if v is not None:
            if not _is_num(v) or not lo <= v <= hi:
                raise APIError(400, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {v!r}", param=name,
                               code="invalid_value")
            params[name] = v
    for name, lo in _INTS.items():
        v = body.get(name)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
                raise APIError(400, f"'{name}' must be an integer" + (f" >= {lo}" if lo is not None else ""),
                               param=name, code="invalid_value")
            params[name] = v
    for name, check in _CHECKED.items():
        if body.get(name) is not None:
            check(body[name])
            params[name] = body[name]
    for name, types in _TYPED.items():
        v = body.get(name)
        if v is not None:
            if not isinstance(v, types):
                raise APIError(400, f"'{name}' has the wrong type", param=name, code="invalid_type")
            params[name] = v
    if "max_completion_tokens" in params:  # OpenRouter and most servers read max_tokens
        params.setdefault("max_tokens", params.pop("max_completion_tokens"))
        params.pop("max_completion_tokens", None)
    return ChatRequest(
        messages=msgs, text=routed_text(msgs), stream=stream, include_usage=bool(options.get("include_usage")),
        params=params, domain=domain, allowed=tuple(allowed) if allowed is not None else None,
        cost_weight=float(cost_weight) if cost_weight is not None else None, budget=budget,
        billed_text="\n".join(_message_text(m) for m in msgs), ignored=ignored, mode=mode or "one_step",
        max_usd=float(max_usd) if max_usd is not None else None, uses_tools=uses_tools,
        prompt_tokens=prompt_tokens_estimate(msgs, params.get("tools")),
    )


def unservable(req: ChatRequest, skipped: list[dict], info: dict, headers: dict) -> APIError:
    """The 400 for a request that no worker of its route could take (each `skipped`: tools it does
    not support, or a context window the prompt does not fit), none having been called or kept out."""
    detail = "; ".join(f"{s['worker']}: {s['reason']}" for s in skipped)
    if any(s["code"] == CONTEXT_EXCEEDED for s in skipped):
        return APIError(400, f"the request does not fit the context window of any worker it may go to ({detail}); "
                        "shorten the messages or lower max_tokens", param="messages", code=CONTEXT_EXCEEDED,
                        extra={"fugu_lite": info}, headers=headers)
    return APIError(400, f"no worker this request may go to supports tools ({detail}); set supports_tools: true in the "
                    "worker YAML for the workers that do, or send the request without tools",
                    param="tools" if "tools" in req.params else "messages", code="tools_not_supported",
                    extra={"fugu_lite": info}, headers=headers)


def parse_budget(raw) -> CostCap | None:
    """`fugu_budget`: {"usd_per_1k": 2.5} or {"share": 0.3}, optionally with "margin_z" (default 1.645),
    or the same cap as `--cap` spells it, "share=0.3" (`cost_cap.py`)."""
    if raw is None:
        return None
    how = ('\'fugu_budget\' must be an object with exactly one of "usd_per_1k" (USD per 1,000 requests, > 0) and '
           '"share" (of the strongest worker\'s cost, > 0), and optionally "margin_z" (>= 0), or a string like '
           '"share=0.3"')
    if isinstance(raw, str):
        try:
            return CostCap.parse(raw[:200], "fugu_budget")
        except CapError as exc:
            raise APIError(400, str(exc), param="fugu_budget", code="invalid_value") from None

    def bad(what: str) -> APIError:  # the field and what is wrong with it first, then the shape
        return APIError(400, f"{what}; {how}", param="fugu_budget", code="invalid_value")

    if not isinstance(raw, dict):
        raise APIError(400, how, param="fugu_budget", code="invalid_value")
    unknown = sorted(set(raw) - _BUDGET_KEYS)
    if unknown:
        raise bad(f"'fugu_budget.{unknown[0][:40]}' is not a budget field")
    for k, v in raw.items():
        if not _is_num(v):
            raise bad(f"'fugu_budget.{k}' must be a finite number, got {_json_type(v)}")
    try:
        return CostCap(**{k: float(v) for k, v in raw.items()})
    except ValidationError as exc:
        e = exc.errors()[0]
        field = f"'fugu_budget.{e['loc'][0]}': " if e["loc"] else ""
        raise bad(field + e["msg"].removeprefix("Value error, ")) from None


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"{v!r:.40}"
    return {str: "a string", dict: "an object", list: "a list", type(None): "null"}.get(type(v), type(v).__name__)


def _message_text(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


async def read_body(request: Request, limit: int) -> bytes:
    too_big = APIError(413, f"request body too large: the limit is {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_big
        parts.append(part)
    return b"".join(parts)
