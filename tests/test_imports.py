"""The import graph: no cycles among the project's modules, the protocol library apart from Temporal and
from the worker's scheduling, the workflow package apart from torch, triton and openai, the agent worker
apart from the GPU worker (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from baselines.parse import parse as parse_source

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("workflows", "baselines", "rules", "gpu_worker", "activities", "cli")
#: the harness and what it runs on: a plain library, usable without a Temporal worker
PROTOCOL = ("gpu_worker.harness", "gpu_worker.child", "gpu_worker.sandbox", "rules.check", "rules.host_language",
            "rules.triton_language", "rules.refusals", "rules.torch_ops", "gpu_worker.guard",
            "gpu_worker.wall", "gpu_worker.timing", "gpu_worker.profile", "gpu_worker.canaries",
            "gpu_worker.devicetime", "gpu_worker.phases", "gpu_worker.sass")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def _graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports, at module level or inside functions alike."""
    mods = _modules()

    def known(name: str | None) -> str | None:
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(parse_source(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from a import b` imports a.b where b is a module, else a
                targets = [known(f"{base}.{a.name}") or known(base) for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t and t != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _imported_after(modules: tuple[str, ...] | list[str]) -> set[str]:
    code = ("import importlib, sys\n"
            f"for m in {list(modules)!r}:\n"
            "    importlib.import_module(m)\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(out.stdout.split())


def test_no_import_cycle_among_the_project_modules():
    graph = _graph()
    cycles = _cycles(graph)
    described = ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_protocol_library_imports_neither_temporal_nor_the_scheduling():
    loaded = _imported_after(PROTOCOL)
    assert not {m for m in loaded if m == "temporalio" or m.startswith("temporalio.")}
    assert "gpu_worker.device.scheduling" not in loaded


def test_the_protocol_modules_name_no_scheduling_or_temporal_import():
    # the static side of the test above: function-local imports too, which only run on some paths
    graph = _graph()
    for mod in PROTOCOL:
        assert "gpu_worker.device.scheduling" not in graph[mod], mod
        for path in [REPO / (mod.replace(".", "/") + ".py"), REPO / mod.replace(".", "/") / "__init__.py"]:
            if path.is_file():
                tree = parse_source(path.read_text())
                names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
                names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
                assert not [n for n in names if n.split(".")[0] == "temporalio"], mod


def test_the_workflow_package_imports_no_torch_triton_or_openai():
    mods = sorted(m for m in _modules() if m.split(".")[0] == "workflows")
    loaded = _imported_after(mods)
    heavy = {m for m in loaded if m.split(".")[0] in ("torch", "triton", "openai")}
    assert not heavy, sorted(heavy)[:10]


def test_the_workflow_definitions_import_no_shared_io_module():
    # what the workflow sandbox re-imports for every run: the modules that define workflows, and theirs
    mods = sorted(m for m, p in _modules().items()
                  if m.split(".")[0] == "workflows" and "from temporalio import workflow" in p.read_text())
    assert "workflows.optimization" in mods
    loaded = _imported_after(mods)
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "triton", "openai", "structlog")}
    assert not loaded & {"workflows.artifacts", "workflows.metrics", "workflows.logs", "cli"}


#: the folders from the bottom up: each imports only those in the layers below it (and itself); the two
#: workers share a layer and import nothing from each other
LAYERS = (("workflows",), ("baselines",), ("rules",), ("gpu_worker", "activities"), ("cli",))


def _layer(module: str) -> int:
    return next(i for i, folders in enumerate(LAYERS) if module.split(".")[0] in folders)


def test_every_import_between_folders_runs_down():
    graph = _graph()
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                if m.split(".")[0] != t.split(".")[0] and _layer(t) >= _layer(m))
    assert not up, "imports that run back up or across:\n" + "\n".join(up)


def test_the_layer_check_refuses_an_import_across_the_workers():
    assert _layer("activities.agent") == _layer("gpu_worker.harness")
    assert _layer("rules.check") < _layer("activities.agent") < _layer("cli.main")


def _names_imported(path: Path) -> list[str]:
    """Every module a file names in an import statement, at module level or inside functions alike."""
    tree = parse_source(path.read_text(), str(path))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    names += [f"{n.module}.{a.name}" if n.module else a.name
              for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level for a in n.names]
    return names


def test_no_file_of_the_agent_worker_names_the_gpu_worker():
    files = sorted((REPO / "activities").rglob("*.py"))
    assert files
    named = sorted(f"{f.relative_to(REPO)}: {n}" for f in files for n in _names_imported(f)
                   if n.split(".")[0] == "gpu_worker")
    assert not named, "the agent worker imports the GPU worker:\n" + "\n".join(named)


def test_importing_the_agent_worker_loads_nothing_of_the_gpu_worker():
    mods = sorted(m for m in _modules() if m.split(".")[0] == "activities")
    assert "activities.worker" in mods
    loaded = _imported_after(mods)
    assert not {m for m in loaded if m.split(".")[0] == "gpu_worker"}
