"""The package's import graph points one way: no cycle between modules, and no module imports
from a layer above its own. Every import counts, at module top or inside a function (a lazy
import is still a dependency), and so do the Python imports of the Cython sources.

Layers, lowest first (a module may import its own layer and those below):

    base     config (settings, the environment), cpu (cores, NUMA, thread plans),
             sampling_params, outputs (the request and result types every layer passes)
    kernels  _kernels/ (the compiled variants, the dispatcher, layouts, the PackedModel)
    model    model/ (checkpoint readers, family recipes, packing, tokenizer),
             multimodal/ (image encoders and preprocessing: a model's other half),
             lora (adapter files -> weights)
    engine   engine/ (scheduler, runner, step loop, tensor and data parallel, pooling)
    server   server/ (HTTP)
    top      programs and the public front: llm (LLM, the engine's assembly), interactive,
             cli, __main__, info, bench/, serve_ray, the package itself (lazy re-exports)

In the lower layers (base, kernels, model) an import of the package inside a function must say
why it is not at the top (a comment on the line or the line above): the one reason is the
compiled kernels, which the checkpoint readers load only when they first need them, so that
`lite_llm info` can read a model where no kernel variant is built.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lite_llm"

LAYERS = ("base", "kernels", "model", "engine", "server", "top")
_LAYER_OF = [   # (module name prefix, layer): the longest matching prefix decides
    ("lite_llm.config", "base"), ("lite_llm.cpu", "base"), ("lite_llm.sampling_params", "base"),
    ("lite_llm.outputs", "base"),
    ("lite_llm._kernels", "kernels"),
    ("lite_llm.model", "model"), ("lite_llm.multimodal", "model"), ("lite_llm.lora", "model"),
    ("lite_llm.engine", "engine"),
    ("lite_llm.server", "server"),
    ("lite_llm.llm", "top"), ("lite_llm.interactive", "top"), ("lite_llm.cli", "top"),
    ("lite_llm.__main__", "top"), ("lite_llm.info", "top"), ("lite_llm.bench", "top"),
    ("lite_llm.serve_ray", "top"), ("lite_llm", "top"),
]

# Imports known to break the rules; the test fails when one of them is gone (delete it here) as
# well as when a new one appears. None remain.
KNOWN: set[tuple[str, str]] = set()

# The Cython sources: kernels.pyx and the .pxi files it includes are one compiled module, which
# the dispatcher exposes as lite_llm._kernels.kernels; other .pyx files are modules of their own.
_COMPILED_KERNELS = "lite_llm._kernels.kernels"
_CYTHON_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(lite_llm[\w.]*)[ \t]+import[ \t]+([\w, ]+)|import[ \t]+(lite_llm[\w.]*))",
                            re.M)


# Names the package root gives (lite_llm/__init__.py): its lazy re-exports are imports of the
# modules that define them; __version__ is a constant of the root, which every import of a
# submodule loads anyway (no edge).
_ROOT_NAMES = {"LLM": "lite_llm.llm", "SamplingParams": "lite_llm.sampling_params",
               "StructuredOutputsParams": "lite_llm.sampling_params",
               "GuidedDecodingParams": "lite_llm.sampling_params", "LoRARequest": "lite_llm.lora",
               "RequestOutput": "lite_llm.outputs", "CompletionOutput": "lite_llm.outputs", "__version__": None}


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    if path.suffix in (".pxi",) or (path.suffix == ".pyx" and parts[-2:] == ["_kernels", "kernels"]):
        return _COMPILED_KERNELS
    return ".".join(parts)


def _sources() -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".pyx", ".pxi") and "web" not in path.relative_to(PACKAGE).parts:
            out.setdefault(_module_of(path), []).append(path)
    return out


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module of the package that importing `name` runs (a module, else its package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, module: str, modules: set[str]):
    """(imported module, line, at module top, the source line and the one above) of each
    import of the package in the file."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    if path.suffix == ".py":
        tree = ast.parse(text)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                         else _ROOT_NAMES.get(a.name, base) if base == "lite_llm" else base for a in node.names]
            for name in names:
                if name is not None and (name == "lite_llm" or name.startswith("lite_llm.")):
                    found.append((name, node.lineno, id(node) in top))
    else:   # Cython: the Python imports, by line; indented ones are inside a function or class
        for m in _CYTHON_IMPORT.finditer(text):
            lineno = text.count("\n", 0, m.start()) + 1
            indented = lines[lineno - 1][:1] in (" ", "\t")
            if m.group(3):
                found.append((m.group(3), lineno, not indented))
            for alias in (m.group(2) or "").split(","):
                alias = alias.strip().split(" ")[0]
                if alias:
                    sub = f"{m.group(1)}.{alias}"
                    found.append((sub if sub in modules else m.group(1), lineno, not indented))
    for name, lineno, at_top in found:
        if name == "lite_llm._kernels.kernels":
            target = _COMPILED_KERNELS
        else:
            target = _resolve(name, modules)
        if target and target != module:
            above = lineno - 1          # the comment may head a run of imports
            while above > 0 and re.match(r"[ \t]*(from|import)[ \t]", lines[above - 1]):
                above -= 1
            yield target, lineno, at_top, "\n".join(lines[max(above - 1, 0):lineno])


def _graph():
    sources = _sources()
    modules = set(sources) | {_COMPILED_KERNELS}
    edges: dict[str, dict[str, list[tuple[Path, int, bool, str]]]] = {}
    for module, paths in sources.items():
        for path in paths:
            for target, lineno, at_top, context in _imports(path, module, modules):
                edges.setdefault(module, {}).setdefault(target, []).append((path, lineno, at_top, context))
    return modules, edges


def layer_of(module: str) -> str:
    best = max((p for p, _ in _LAYER_OF if module == p or module.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{module}: no layer; add it to _LAYER_OF"
    return dict(_LAYER_OF)[best]


def _cycles(modules: set[str], edges: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return out


def _where(edges, a: str, b: str) -> str:
    return ", ".join(dict.fromkeys(f"{p.relative_to(PACKAGE.parent)}:{n}" for p, n, _, _ in edges[a][b]))


def test_every_module_has_a_layer():
    modules, _ = _graph()
    for module in modules:
        assert layer_of(module) in LAYERS


def test_the_known_exceptions_are_still_real():
    """Each KNOWN import still exists: once it is gone, it comes off the list."""
    _, edges = _graph()
    gone = sorted(pair for pair in KNOWN if pair[1] not in edges.get(pair[0], {}))
    assert not gone, f"no longer imported, remove from KNOWN: {gone}"


def test_no_import_points_up_a_layer():
    _, edges = _graph()
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            if rank[layer_of(b)] > rank[layer_of(a)] and (a, b) not in KNOWN:
                bad.append(f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)}) at {_where(edges, a, b)}")
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def test_no_import_cycle():
    modules, edges = _graph()
    kept = {a: {b: v for b, v in t.items() if (a, b) not in KNOWN} for a, t in edges.items()}
    cycles = _cycles(modules, kept)
    described = []
    for comp in cycles:
        members = set(comp)
        described.append(" | ".join(f"{a} -> {b} ({_where(edges, a, b)})" for a in comp
                                    for b in kept.get(a, {}) if b in members))
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_lower_layers_import_at_module_top_or_say_why():
    """In base, kernels and model, an import of the package inside a function carries a comment
    (on its line or the one above) saying why it is deferred."""
    _, edges = _graph()
    bad = []
    for a, targets in sorted(edges.items()):
        if layer_of(a) not in ("base", "kernels", "model"):
            continue
        for b, places in sorted(targets.items()):
            for path, lineno, at_top, context in places:
                if not at_top and "#" not in context:
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {a} -> {b}")
    assert not bad, "function-local imports without a reason:\n" + "\n".join(bad)


def test_the_walker_sees_what_it_must():
    """The graph includes function-local imports, relative imports and the Cython sources'
    imports (guards against a walker that silently finds nothing)."""
    _, edges = _graph()
    assert "lite_llm._kernels.kv_layout" in edges[_COMPILED_KERNELS]              # common.pxi
    assert "lite_llm.engine.detokenizer" in edges["lite_llm.engine._step"]         # _step.pyx
    assert any(not top for _, _, top, _ in edges["lite_llm.model.loader"]["lite_llm._kernels._cpu"])   # a lazy import
    assert "lite_llm.model.arch.llama" in edges["lite_llm.model.arch"]


def test_the_readers_and_processors_import_without_a_kernel_build():
    """What the deferred imports are for: the checkpoint readers, the image processors and the
    adapter reader import, and load no kernel module, where no kernel variant can be loaded."""
    code = ("import sys, lite_llm.model.loader, lite_llm.model.arch, lite_llm.multimodal, lite_llm.lora\n"
            "print(sorted(m for m in sys.modules if m.startswith('lite_llm._kernels')))")
    env = dict(os.environ, LITE_LLM_ISA="no-such-variant", PYTHONPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
