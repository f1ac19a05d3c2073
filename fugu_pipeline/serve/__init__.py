"""The OpenAI-compatible router server (`fugu-lite serve`). See `app.py` for the protocol."""

from fugu_pipeline.serve.app import create_app, load_router_provider
from fugu_pipeline.serve.batching import RouteBatcher, RouteRequest
from fugu_pipeline.serve.run import serve

__all__ = ["create_app", "load_router_provider", "serve", "RouteBatcher", "RouteRequest"]
