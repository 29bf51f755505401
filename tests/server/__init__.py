"""Server tests: real HTTP on 127.0.0.1 against a FakeEngine (or the real one)."""
