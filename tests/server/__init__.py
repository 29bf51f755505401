"""Server tests: real HTTP on 127.0.0.1 against the engine over a fake model runner (or a real model)."""
