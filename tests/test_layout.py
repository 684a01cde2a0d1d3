"""The tree's layering, pinned: imports run one way, so the folders can be read top-down.

`proxy -> extraction -> memory_core`; inside proxy, `cli -> wiring/app -> admin -> memory
-> relay`, with the edge's identity a leaf every layer may read. Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; `from a import b` also counts `a.b`)."""
    names: set[str] = set()
    package = _module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def _offenders(package: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list:
    found = []
    for path in _files(package):
        for name in sorted(_imports(path)):
            hit = any(name == f or name.startswith(f + ".") for f in forbidden)
            spared = any(name == a or name.startswith(a + ".") for a in allowed)
            if hit and not spared:
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


RULES = [
    ("memory_core", ("proxy", "extraction"), ()),
    ("extraction", ("proxy",), ()),
    (
        "proxy.relay",
        ("proxy.memory", "proxy.admin", "proxy.cli", "proxy.edge", "proxy.app", "proxy.wiring"),
        ("proxy.edge.identity",),
    ),
    (
        "proxy.memory",
        ("proxy.admin", "proxy.cli", "proxy.edge", "proxy.app", "proxy.wiring"),
        ("proxy.edge.identity",),
    ),
    ("proxy.admin", ("proxy.cli", "proxy.wiring"), ()),
    ("proxy.edge", ("proxy.memory", "proxy.admin", "proxy.cli", "proxy.app", "proxy.wiring"), ()),
]


@pytest.mark.parametrize(("package", "forbidden", "allowed"), RULES, ids=[r[0] for r in RULES])
def test_imports_run_one_way(package: str, forbidden: tuple, allowed: tuple) -> None:
    assert _files(package), f"{package} has no modules: the layout changed, update this test"
    assert _offenders(package, forbidden, allowed) == []


def test_identity_is_a_leaf() -> None:
    """Every layer reads who a request is; the identity itself depends on nothing of proxy's."""
    names = _imports(ROOT / "proxy" / "edge" / "identity.py")
    assert sorted(n for n in names if n.startswith("proxy")) == []


def test_only_the_cli_imports_the_cli() -> None:
    found = []
    for package in ("proxy", "memory_core", "extraction"):
        for path in _files(package):
            if "cli" in path.relative_to(ROOT).parts:
                continue
            found += [f"{path.name}: {n}" for n in _imports(path) if n.startswith("proxy.cli")]
    assert found == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules above pass only because the tree obeys them, not because nothing is read."""
    assert "proxy.memory.scoping" in _imports(ROOT / "proxy" / "memory" / "recall.py")
    assert _offenders("proxy.memory", ("proxy.relay",)) != []
