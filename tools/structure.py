"""The package's structure, drawn from its source: the import graph, its cycles, the layering rules, and
the longest function and largest class.

    python tools/structure.py [eu_audit]

Every import counts, at module level or inside a function (a function-level import is still a
dependency), and so does the package ``__init__`` an import runs first; only imports under
``if TYPE_CHECKING:`` are left out of the runtime graph (the type-only graph and the folder loops count
them). A folder is a subpackage (``eu_audit.audits``) or a top-level module. Exit 1 when a rule is
broken: a cycle of either graph, a folder loop or a forbidden import.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

#: (importer prefix, imported prefix): a module under the first must not import one under the second
FORBIDDEN = [
    ("eu_audit.runtime", "eu_audit.bundle"),  # the runtime works on the domain, not on the file format
    ("eu_audit.trace", "eu_audit.bundle"),
    ("eu_audit.trace", "eu_audit.runtime"),  # the trace is what a run produced, not how it runs
    ("eu_audit.engines", "eu_audit.runtime.agent"),  # engines know models and caches, not agents
    ("eu_audit.engines", "eu_audit.audits"),
    ("eu_audit.bundle", "eu_audit.runtime.agent"),
    ("eu_audit.engines", "eu_audit.runtime"),  # ... nor the runtime that drives them
    ("eu_audit.models", "eu_audit.engines"),  # where the weights come from sits below what runs them
    ("eu_audit.audits", "eu_audit.audit"),  # what measures and decides never imports its orchestrator
    # the data sets sit above everything they register into: the registries read their modules by name
    ("eu_audit.registry", "eu_audit.datasets"),
    ("eu_audit.plugins", "eu_audit.datasets"),
    # the audits report what the harness found in the words of eu_audit.tiers, never by importing it
    ("eu_audit.audits", "eu_audit.blackbox"),
]


@dataclass(frozen=True)
class Sized:
    name: str
    where: str
    lines: int


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skip


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, *, type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports; ``type_only`` counts imports under ``TYPE_CHECKING`` too
    (a type-only import is still a dependency a reader follows)."""
    mods = modules(root)
    pkg = root.name
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = set() if type_only else _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, path.name == "__init__.py", node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                if name.split(".")[0] == pkg:
                    t = _target(name, mods)
                    if t and t != mod:
                        graph[mod].add(t)
                        # importing a.b.c runs package a.b's __init__ first (unless mod is inside a.b)
                        parts = t.split(".")
                        for k in range(2, len(parts)):
                            parent = ".".join(parts[:k])
                            if parent in mods and not mod.startswith(parent + ".") and parent != mod:
                                graph[mod].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the package's folders (``eu_audit.audits``, ``eu_audit.blackbox``, ...):
    a top-level module is a folder of its own."""

    def folder(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {folder(m): set() for m in graph}
    for a, targets in graph.items():
        out[folder(a)].update(folder(b) for b in targets if folder(b) != folder(a))
    return out


def module_lines(root: Path) -> Sized:
    """The largest module, by lines."""
    return max(
        (Sized(mod, str(path), len(path.read_text().splitlines())) for mod, path in modules(root).items()),
        key=lambda s: s.lines,
    )


def repeated_names(root: Path) -> dict[str, list[str]]:
    """Public top-level names (functions, classes, assignments) defined in more than one module."""
    seen: dict[str, list[str]] = {}
    for mod, path in modules(root).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                value = node.value
                if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("TypeVar"):
                    continue  # a type variable (``T``) is a local convention, not a definition
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    seen.setdefault(name, []).append(mod)
    return {k: v for k, v in sorted(seen.items()) if len(v) > 1}


def forbidden_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    def under(mod: str, prefix: str) -> bool:
        return mod == prefix or mod.startswith(prefix + ".")

    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        for pa, pb in FORBIDDEN
        if under(a, pa) and under(b, pb)
    )


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's logic: from its first statement after the docstring to its end (a CLI
    command's signature of option declarations is not logic)."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (node.end_lineno or node.lineno) - body[0].lineno + 1


def largest(root: Path) -> tuple[Sized, Sized, Sized]:
    """(longest function, longest function body, largest class) by lines."""
    fn = body = cls = Sized("", "", 0)
    for mod, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                size = Sized(
                    node.name, f"{mod}:{node.lineno}", (node.end_lineno or node.lineno) - node.lineno + 1
                )
                if isinstance(node, ast.ClassDef):
                    cls = max(cls, size, key=lambda s: s.lines)
                else:
                    fn = max(fn, size, key=lambda s: s.lines)
                    logic = Sized(node.name, size.where, _body_lines(node))
                    body = max(body, logic, key=lambda s: s.lines)
    return fn, body, cls


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent / "eu_audit")
    graph = import_graph(root)
    found, bad = cycles(graph), forbidden_edges(graph)
    for comp in found:
        print("cycle:", " <-> ".join(comp))
    for a, b in bad:
        print(f"forbidden: {a} imports {b}")
    typed = cycles(import_graph(root, type_only=True))
    for comp in typed:
        print("cycle (type-only imports counted):", " <-> ".join(comp))
    loops = cycles(folder_graph(import_graph(root, type_only=True)))
    for comp in loops:
        print("folder loop:", " <-> ".join(comp))
    repeated = repeated_names(root)
    for name, where in repeated.items():
        print(f"defined twice: {name} in {', '.join(where)}")
    fn, body, cls = largest(root)
    big = module_lines(root)
    edges = sum(map(len, graph.values()))
    print(f"modules {len(graph)}, imports {edges}, cycles {len(found)}, forbidden {len(bad)}")
    print(
        f"cycles with type-only imports {len(typed)}, folder loops {len(loops)}, "
        f"names defined twice {len(repeated)}"
    )
    print(f"largest module: {big.name} ({big.lines} lines)")
    print(f"longest function: {fn.name} ({fn.lines} lines, {fn.where})")
    print(f"longest function body: {body.name} ({body.lines} lines, {body.where})")
    print(f"largest class: {cls.name} ({cls.lines} lines, {cls.where})")
    return 1 if found or bad or typed or loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
