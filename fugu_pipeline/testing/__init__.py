"""Loopback test doubles that tests and benchmarks share: a stub OpenAI-compatible LLM server with
injectable latency and faults, and serving building blocks. Nothing in the core imports this."""
