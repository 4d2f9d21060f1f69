"""The layer rule of DESIGN.md: a module imports only from its own layer or the layers above it."""

import ast
from pathlib import Path

import grpo

ROOT = Path(grpo.__file__).parent
LAYERS = [
    {"config", "rollout", "presets"},                                   # vocabulary
    {"rewards", "advantages", "loss", "passk"},                         # algorithm (pure)
    {"models", "decoder", "heap", "data", "tasks", "distributed", "checkpoint", "tracking", "progress",
     "reward_sources", "tools", "environments", "vision"},              # infrastructure
    {"sampling", "vllm_sampler", "update", "episodes"},                 # steps
    {"train", "sft", "cli", "report", "bench", "build", "explain", "__main__", "resume", "metrics",
     "evaluate", "score", "pipeline"},                                   # composition
]
PURE = LAYERS[1]


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"module grpo.{name} is in no layer; add it to DESIGN.md and this test")


def top_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return rel.parts[0]


def grpo_imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo"):
            parts = node.module.split(".")
            names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
            out += [(n, node.lineno) for n in names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("grpo."):
                    out.append((alias.name.split(".")[1], node.lineno))
    return out


def all_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def modules():
    return [p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT]


def test_every_module_imports_only_its_own_layer_or_above():
    violations = []
    for path in modules():
        own = layer_of(top_name(path))
        for name, line in grpo_imports(path):
            if layer_of(name) > own:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports grpo.{name}")
    assert violations == []


def test_algorithm_layer_is_pure():
    banned = ("transformers", "torch.distributed", "logging", "grpo.config")
    found = [f"{p.relative_to(ROOT)} imports {name}" for p in modules() if top_name(p) in PURE
             for name in all_imports(p) if name.startswith(banned)]
    assert found == []


def test_the_rule_catches_a_violation(tmp_path):
    # The checker itself must see an upward import, or the tests above prove nothing.
    bad = tmp_path / "bad.py"
    bad.write_text("from grpo.train import train\n")
    assert grpo_imports(bad) == [("train", 1)]
    assert layer_of("train") > layer_of("loss")
