"""The layer rule of docs/architecture.md: a module imports only from its own layer or the layers
above it; no two modules and no two packages import each other (imports inside functions count);
and the table here is the table there."""

import ast
import re
from pathlib import Path

import grpo

ROOT = Path(grpo.__file__).parent
DOCS = ROOT.parents[1] / "docs" / "architecture.md"
LAYERS = [
    ("vocabulary", {"config", "rollout"}),
    ("algorithm", {"algorithm"}),
    ("infrastructure", {"vision", "sandbox", "models", "data", "rewards", "agents", "run"}),
    ("steps", {"sampling", "inputs", "update", "sft", "step", "evaluate"}),
    ("composition", {"assembly", "pipeline", "train", "commands", "__main__"}),
]
PURE = LAYERS[1][1]
MOST_MODULES = 8   # in one package, its __init__ left out


def layer_of(name: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"grpo.{name} is in no layer; add it to docs/architecture.md and this test")


def dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {dotted(p): p for p in ROOT.rglob("*.py") if p != ROOT / "__init__.py"}


def imported(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The grpo modules a file imports (at any depth: inside functions too), with their lines;
    `from grpo.x import y` counts as grpo.x.y where that is a module, else as grpo.x."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and (node.module == "grpo" or node.module.startswith("grpo.")):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.append((name if name in known else node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("grpo.")]
    return out


def top(name: str) -> str:
    return name.split(".")[1]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: {m for m, _ in imported(path, set(found)) if m != name and m in found}
            for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the directed graph, as the names along it, or []."""
    state, trail = {}, []

    def visit(node):
        state[node] = "open"
        trail.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        trail.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        out.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
    return out


def test_every_module_imports_only_its_own_layer_or_above():
    found = modules()
    violations = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                  for module, path in found.items() for name, line in imported(path, set(found))
                  if name != "grpo" and layer_of(top(name)) > layer_of(top(module))]
    assert violations == []


def test_no_two_modules_and_no_two_packages_import_each_other():
    edges = graph()
    assert cycle(edges) == []
    assert cycle(package_edges(edges)) == []


def test_no_package_holds_more_than_about_eight_modules():
    sizes = {}
    for path in ROOT.rglob("*.py"):
        if path.parent != ROOT and path.name not in ("__init__.py", "__main__.py"):
            sizes[path.parent.relative_to(ROOT)] = sizes.get(path.parent.relative_to(ROOT), 0) + 1
    assert {str(p): n for p, n in sizes.items() if n > MOST_MODULES} == {}


def test_algorithm_layer_is_pure():
    banned = ("transformers", "torch.distributed", "logging", "grpo.")
    found = [f"{p.relative_to(ROOT)} imports {name}" for m, p in modules().items() if top(m) in PURE
             for node in ast.walk(ast.parse(p.read_text()))
             for name in ([node.module or ""] if isinstance(node, ast.ImportFrom)
                          else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
             if name.startswith(banned) and not name.startswith("grpo.algorithm")]
    assert found == []


def test_the_table_is_the_one_in_docs_architecture_md():
    rows = re.findall(r"^\| (\w+) \| (.+?) \| .+ \|$", DOCS.read_text(), re.M)
    documented = [(layer, {n.rstrip("/").removesuffix(".py") for n in re.findall(r"`([^`]+)`", cell)})
                  for layer, cell in rows if layer != "layer"]
    assert documented == LAYERS
    assert set().union(*(names for _, names in LAYERS)) == {top(m) for m in modules()}


def test_the_checks_see_what_they_must(tmp_path):
    # An upward import, an import inside a function and a cycle must be seen, or the tests above
    # prove nothing.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from grpo.train import train\n")
    assert imported(bad, {"grpo.train"}) == [("grpo.train", 2)]
    assert layer_of("train") > layer_of("algorithm")
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
    assert package_edges({"grpo.x.a": {"grpo.y.b"}, "grpo.y.b": {"grpo.x.c"}}) == {"x": {"y"}, "y": {"x"}}


def test_every_long_module_and_function_says_why_in_its_docstring():
    """About 400 lines a module and 60 a function, with 10% to spare; a longer one says why in its
    docstring ("Longer than about 400 lines: ..." or "Longer than about 60 lines: ...", as
    docs/architecture.md asks), and one that says so is still long."""
    unsaid, stale = [], []
    for path in ROOT.rglob("*.py"):
        name, source = path.relative_to(ROOT).as_posix(), path.read_text()
        tree = ast.parse(source)
        nodes = [(name, tree, 440, len(source.splitlines()), "400")]
        nodes += [(f"{name}: {node.name}", node, 66, node.end_lineno - node.lineno + 1, "60")
                  for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for label, node, limit, size, said in nodes:
            reason = f"Longer than about {said} lines: " in (ast.get_docstring(node) or "").replace("\n", " ")
            if size > limit and not reason:
                unsaid.append(label)
            if reason and size <= limit:
                stale.append(label)
    assert unsaid == [], "longer than about 400 (a module) or 60 (a function) lines, with no reason"
    assert stale == [], "says it is long, and no longer is"
