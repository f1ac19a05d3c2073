"""Print every import loop among the modules of a package (module-level and function-level imports
alike); exit 1 when there is one. `python scripts/import_cycles.py [package_dir]`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_graph(pkg: Path) -> dict[str, set[str]]:
    names = {".".join(p.relative_to(pkg.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in names}
    for mod, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` imports the submodule `pkg.sub`; `from mod import name` imports `mod`
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                           for a in node.names]
            graph[mod] |= {t for t in targets if t in names and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

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


if __name__ == "__main__":
    pkg = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "fugu_pipeline")
    g = module_graph(pkg)
    found = cycles(g)
    for c in found:
        print("import loop:", " <-> ".join(c))
    print(f"{len(g)} modules, {sum(map(len, g.values()))} internal imports, {len(found)} import loop(s)")
    sys.exit(1 if found else 0)
