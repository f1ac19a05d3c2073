"""Workers: the call contract and its errors, the worker YAML, the mock pool, the HTTP clients
with their one retry policy, the OpenRouter catalog, and the budget guard."""
