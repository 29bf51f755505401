"""The OpenAI-compatible HTTP server: app.py (the `serve` command and its public names; it
lists where everything else lives), routes.py (the route table), transport.py (sockets).

Nothing is imported here: `lite-llm serve` loads lite_llm.server.app only when it runs.
"""
