"""The engine layer's imports point one way: down to the model and the kernels, never up to the
programs above it (the offline API, the CLI programs, the server, the benchmarks), and the
engine's own modules import each other without a cycle. Importing the assembly loads no
OpenMP runtime before it configures one (libgomp reads its environment once, as it loads)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "lite_llm" / "engine"
ABOVE = ("lite_llm.llm", "lite_llm.info", "lite_llm.cli", "lite_llm.interactive", "lite_llm.server",
         "lite_llm.bench", "lite_llm.serve_ray")


def imports_of(path: Path, top_only: bool = False) -> set[str]:
    """The lite_llm modules a file imports (every import, or those at module level only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lite_llm"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("lite_llm"))
    return out


def test_the_engine_imports_nothing_above_it():
    found = {(p.name, m) for p in ENGINE.glob("*.py") for m in imports_of(p)
             if any(m == a or m.startswith(a + ".") for a in ABOVE)}
    assert not found, f"engine modules importing a higher layer: {sorted(found)}"


def test_engine_modules_import_each_other_without_a_cycle():
    names = {p.stem for p in ENGINE.glob("*.py")}
    edges = {}
    for p in ENGINE.glob("*.py"):     # every import counts: a function-local one is an edge all the same
        edges[p.stem] = {m.split(".")[2] for m in imports_of(p)
                         if m.startswith("lite_llm.engine.") and m.split(".")[2] in names} - {p.stem}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path + [node, nxt])}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])


def test_importing_the_assembly_loads_no_openmp_runtime():
    code = ("import sys; import lite_llm.llm, lite_llm.engine.assemble, lite_llm.engine.data_parallel; "
            "print(sorted(m for m in ('lite_llm._kernels', 'lite_llm._kernels._cpu', 'lite_llm.engine._sampler')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
