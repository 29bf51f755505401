"""The OpenAI-compatible HTTP server: app.py (routes, CLI), openai.py (bodies), metrics.py, openapi.py.

Nothing is imported here: `lite-llm serve` loads lite_llm.server.app only when it runs.
"""
