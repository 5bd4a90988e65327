"""The package's layers: components -> recipes -> apps. A module imports only from its own layer or below, so a
model never reaches for the index or a recipe, and nothing but the CLI imports the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import realm

PACKAGE = Path(realm.__file__).parent
# cli > pipeline > recipes, serve > eval > index > models > training, data > config, common
LAYER = {
    "config": 0,
    "common": 0,
    "data": 1,
    "training": 1,
    "models": 2,
    "index": 3,
    "eval": 4,
    "recipes": 5,
    "serve": 5,
    "pipeline": 6,
    "cli": 7,
}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):  # function-local imports too
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("realm."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("realm.")}
    return found


def test_every_module_imports_only_from_its_layer_or_below():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "realm." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if _part(module) not in LAYER:  # realm/__init__.py
            continue
        for imported in _imports(path):
            if LAYER[_part(imported)] > LAYER[_part(module)]:
                upward.append(f"{module} imports {imported}")
    assert not upward, upward


def test_no_module_is_much_longer_than_300_lines():
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(lengths.values()) <= 330, sorted(lengths.items(), key=lambda kv: -kv[1])[:3]


def test_the_package_shows_the_paper():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == {
        "common",
        "data",
        "models",
        "index",
        "eval",
        "recipes",
        "pipeline",
        "serve",
        "cli",
    }
