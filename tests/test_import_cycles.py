"""No import cycles between the project's modules (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aesrl_queue", "workers", "scheduler", "cli")


def imports() -> dict[str, set[str]]:
    files = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
             for pkg in PACKAGES for path in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` imports the module pkg.sub when there is one
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files]
                deps.update(subs or [node.module])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d.split(".")[0] in PACKAGES and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, path + [dep])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_through_others() -> None:
    graph = imports()
    assert {"cli.main", "cli.launch", "cli.export", "aesrl_queue.nets", "aesrl_queue.numpy_actor"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
