"""The OpenAI-compatible router server (`fugu-lite serve`). See `app.py` for the protocol.

The names below load on first use, so the command line can read `connections.ConnectionLimits`
(its flags' defaults) without importing the server."""

from importlib import import_module

_WHERE = {"create_app": "app", "load_router_provider": "app", "serve": "run", "RouteBatcher": "batching",
          "RouteRequest": "batching"}
__all__ = ["create_app", "load_router_provider", "serve", "RouteBatcher", "RouteRequest"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"fugu_pipeline.serve.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'fugu_pipeline.serve' has no attribute {name!r}")
