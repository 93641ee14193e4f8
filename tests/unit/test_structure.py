"""The structure of the package, checked from its imports (ast, no code run): dependencies point inwards
(DESIGN.md section 2), packages import each other without a circle, and the request path is the five files a
newcomer reads: route, turn service, upstream exchange, recall loop, planner."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memci_proxy"
# Top-level modules that may import memci_proxy.api: the composition root, the command line, and the generator of the
# metrics reference (it registers every route's metrics to list them).
MAY_IMPORT_API = {"memci_proxy.app", "memci_proxy.cli", "memci_proxy.__main__", "memci_proxy.metrics_doc"}
# What the pure engine may import besides the standard library.
ENGINE_THIRD_PARTY = {"xxhash", "msgspec", "tokenizers"}  # tokenizers: the optional exact counter


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def imports() -> dict[str, set[str]]:
    """Module -> the modules it imports (absolute names; relative imports resolved; TYPE_CHECKING blocks too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        graph[name] = found
    return graph


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "memci_proxy" or len(parts) < 2:
        return None
    return "memci_proxy." + parts[1] if (PACKAGE / parts[1]).is_dir() else module


def package_graph() -> dict[str, set[str]]:
    modules = imports()
    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        source = package_of(module)
        if source is None:
            continue
        for target in targets:
            dest = package_of(target)
            if dest is not None and dest != source and (dest in modules or any(m.startswith(dest + ".") for m in modules)):
                graph.setdefault(source, set()).add(dest)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None and (cycle := visit(node)):
            return cycle
    return None


def test_nothing_below_the_routes_imports_api():
    upward = sorted(
        (module, target)
        for module, targets in imports().items()
        if not module.startswith("memci_proxy.api") and module not in MAY_IMPORT_API
        for target in targets
        if target == "memci_proxy.api" or target.startswith("memci_proxy.api.")
    )
    assert upward == []


def test_the_packages_import_each_other_without_a_circle():
    assert find_cycle(package_graph()) is None


def test_the_modules_import_each_other_without_a_circle():
    modules = imports()
    graph = {m: {t for t in targets if t in modules and t != m} for m, targets in modules.items()}
    # a package's __init__ re-exporting its modules is not a circle of its own
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    assert find_cycle(graph) is None


def test_the_layers_point_inwards():
    graph = package_graph()
    assert "memci_proxy.api" not in set().union(*(v for k, v in graph.items() if k not in MAY_IMPORT_API))
    assert "memci_proxy.turn" not in graph.get("memci_proxy.upstream", set())
    assert not {"memci_proxy.turn", "memci_proxy.upstream"} & graph.get("memci_proxy.recall", set())
    assert not {"memci_proxy.turn", "memci_proxy.upstream", "memci_proxy.recall"} & graph.get("memci_proxy.store", set())
    engine_imports = {t for m, ts in imports().items() if m.startswith("memci_proxy.engine") for t in ts}
    outside = {t.split(".")[0] for t in engine_imports if not t.startswith("memci_proxy.engine") and not t.startswith(".")}
    import sys

    assert outside - set(sys.stdlib_module_names) - ENGINE_THIRD_PARTY - {""} == set()
    assert not any(t.startswith("memci_proxy.") and not t.startswith("memci_proxy.engine") for t in engine_imports)


def test_the_request_path_is_five_files():
    """route -> turn service -> upstream exchange -> recall loop, with the planner in the engine."""
    modules = imports()
    path = ["memci_proxy.api.routes", "memci_proxy.turn.service", "memci_proxy.upstream.exchange",
            "memci_proxy.recall.tool.loop", "memci_proxy.engine.planner"]
    assert all(m in modules for m in path)
    assert "memci_proxy.upstream.exchange" in {t.rsplit(".", 1)[0] for t in modules["memci_proxy.api.routes"]} | modules["memci_proxy.api.routes"]
    assert "memci_proxy.upstream.exchange" in modules["memci_proxy.turn.service"]
    assert "memci_proxy.recall.tool.loop" in modules["memci_proxy.upstream.exchange"]
    assert "memci_proxy.engine.plan" in modules["memci_proxy.turn.service"] and "memci_proxy.engine.planner" in modules["memci_proxy.engine"] | {
        f"memci_proxy.engine.{t}" for t in ("planner",)}
    # the Litestar request stays in api/: nothing below it imports the web framework
    web = sorted(m for m, ts in modules.items() if not m.startswith("memci_proxy.api") and m not in MAY_IMPORT_API
                 and any(t == "litestar" or t.startswith("litestar.") for t in ts))
    assert web == []


def test_recall_is_grouped_by_concern():
    """recall/ holds its entry point (resolver) and groups, each a package that says what it holds; a group's
    modules import no group above them in the search's stack (the tool and the push use the search, not back)."""
    recall = PACKAGE / "recall"
    assert sorted(p.name for p in recall.glob("*.py")) == ["__init__.py", "resolver.py"]
    def folders(path: Path) -> list[str]:
        return sorted(p.name for p in path.iterdir() if p.is_dir() and p.name != "__pycache__")

    groups = folders(recall)
    assert groups == ["dates", "lexical", "push", "reading", "search", "tool", "users", "vectors"]
    for group in groups:
        init = recall / group / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), group
        assert folders(recall / group) == [], group
    below = {"lexical": {"tool", "push", "users", "search", "vectors", "reading"}, "dates": {"tool", "push", "users"}}
    for module, targets in imports().items():
        parts = module.split(".")
        if parts[:2] != ["memci_proxy", "recall"] or len(parts) < 4 or parts[2] not in below:
            continue
        reached = {t.split(".")[2] for t in targets if t.startswith("memci_proxy.recall.") and len(t.split(".")) > 3}
        assert not reached & below[parts[2]], (module, reached & below[parts[2]])
