"""The house figures of a checkout: modules, package faces, the longest modules and functions,
and import cycles (imports inside functions counted), read from the source as text.

    python benchmarks/house.py [CHECKOUT]        # default: this checkout

One line per figure; the same figures tests/test_layers.py holds the code to.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def dotted(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and (node.module == "grpo" or node.module.startswith("grpo.")):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("grpo.")}
    return out & known


def cycles(edges: dict[str, set[str]]) -> int:
    """The strongly connected parts of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), 0, [0]

    def visit(v):
        nonlocal found
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            found += len(part) > 1

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> None:
    root = (Path(argv[0]) if argv else Path(__file__).resolve().parents[1]) / "src" / "grpo"
    files = sorted(root.rglob("*.py"))
    known = {dotted(root, p) for p in files}
    edges = {dotted(root, p): imports(p, known) - {dotted(root, p)} for p in files}
    top = lambda name: name.split(".")[1] if name.count(".") else name  # noqa: E731
    packages: dict[str, set[str]] = {}
    for name, targets in edges.items():
        packages.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
    lines = {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in files}
    faces = {n: k for n, k in lines.items() if n.endswith("__init__.py")}
    long_functions = sorted(
        (node.end_lineno - node.lineno + 1, f"{p.relative_to(root).as_posix()}: {node.name}")
        for p in files for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60)
    print(f"modules: {len(files)}, {sum(lines.values())} lines")
    print(f"package faces: {len(faces)}, {sum(faces.values())} lines; over 40 lines: "
          + (", ".join(f"{n} {k}" for n, k in sorted(faces.items(), key=lambda x: -x[1]) if k > 40) or "none"))
    big = sorted(((k, n) for n, k in lines.items() if k > 400), reverse=True)
    print(f"modules over 400 lines: {len(big)} ({sum(k > 600 for k, _ in big)} over 600): "
          + ", ".join(f"{n} {k}" for k, n in big))
    print(f"functions over 60 lines: {len(long_functions)}: "
          + ", ".join(f"{n} {k}" for k, n in reversed(long_functions)))
    print(f"import cycles: {cycles(edges)} among modules, {cycles(packages)} among packages")


if __name__ == "__main__":
    main(sys.argv[1:])
