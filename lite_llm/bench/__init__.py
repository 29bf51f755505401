"""Benchmarks as programs, not tests: `lite-llm bench {latency,throughput,serve}`."""
