"""What the import-linter contracts of pyproject.toml (``make lint``: the layers of the code and
of ``jobs/services``, what the executor, the contract and the CLI may not import) cannot say,
enforced by walking the source (no imports run):

- ``providers`` (adapters) import neither ``jobs`` nor ``trainhub``, but for the listed lazy
  imports; Django only lazily, for settings inside an adapter factory.
- No import inside a function body in ``jobs/services`` unless a comment on its line says why.
- No circle of modules anywhere in the code (imports inside functions count).
- No top-level folder holds more than 35 % of the code's lines (tests and migrations aside).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lazy imports across a package rule, each with its reason.
ALLOWED_LAZY = {
    # The limiter shares the control plane's Redis connection; adapters run only there.
    ("providers.ratelimit", "trainhub.shared_redis"),
}
# The packages of the code (tests/ and bench/ aside), as pyproject's import-linter lists them.
PACKAGES = [
    "trainhub", "api", "console", "jobs", "providers", "gpu_worker", "trainhub_contract",
    "trainhub_cli", "devsupport",
]  # fmt: skip


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (``from a import b`` → a.b when a/b.py exists)
    line: int
    in_function: bool
    commented: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(path: Path) -> Iterator[Import]:
    source = module_name(path)
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{a.name}" if is_module(f"{node.module}.{a.name}") else node.module
                for a in node.names
            ]
        else:
            continue
        commented = "#" in lines[node.lineno - 1]
        for name in names:
            yield Import(source, name, node.lineno, id(node) in inside, commented)


def package_imports(package: str) -> list[Import]:
    files = (ROOT / package).rglob("*.py")
    return [i for f in files if "migrations" not in f.parts for i in imports_of(f)]


def top(name: str) -> str:
    return name.split(".")[0]


def test_providers_import_neither_jobs_nor_trainhub_and_django_only_lazily() -> None:
    bad = []
    for i in package_imports("providers"):
        crosses = top(i.target) in {"jobs", "trainhub"}
        if crosses and (i.source, i.target) not in ALLOWED_LAZY:
            bad.append(f"{i.source}:{i.line} imports {i.target}")
        if top(i.target) == "django" and not i.in_function:
            bad.append(f"{i.source}:{i.line} imports {i.target} at module level")
    assert bad == []


def test_no_unexplained_import_inside_a_service_function() -> None:
    bad = [
        f"{i.source}:{i.line} imports {i.target} inside a function"
        for i in package_imports("jobs/services")
        if i.in_function and not i.commented
    ]
    assert bad == []


def test_no_circle_of_modules() -> None:
    """Counting imports inside functions: a package's __init__ may import its modules, but
    then none of them may import the package back."""
    graph: dict[str, set[str]] = {}
    for i in (i for package in PACKAGES for i in package_imports(package)):
        if top(i.target) in PACKAGES and i.target != i.source:
            graph.setdefault(i.source, set()).add(i.target)

    def circle_from(start: str) -> list[str] | None:
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = {" → ".join(c) for m in graph if (c := circle_from(m))}
    assert circles == set()


@pytest.mark.parametrize("package", ["gpu_worker", "providers", "jobs/services", "api"])
def test_the_walk_sees_imports(package: str) -> None:
    """Guards the guard: a walk that found nothing would pass every rule above."""
    assert len(package_imports(package)) > 20


def test_no_folder_holds_over_a_third_of_the_code() -> None:
    """A folder that grows past 35 % of the lines wants splitting by what its parts are."""
    lines = {
        package: sum(
            len(f.read_text().splitlines())
            for f in (ROOT / package).rglob("*.py")
            if "migrations" not in f.parts
        )
        for package in [*PACKAGES, "bench"]
    }
    total = sum(lines.values())
    assert total > 20_000, lines  # guards the guard: the walk found the code
    over = {p: f"{n / total:.0%}" for p, n in lines.items() if n > 0.35 * total}
    assert over == {}


def test_architecture_lists_every_package() -> None:
    """docs/ARCHITECTURE.md's *Packages* table names every package of the code, so a newcomer
    finds each folder there in one hop."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = doc.split("## Packages", 1)[1].split("\n## ", 1)[0]
    packages = {
        init.parent.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert len(packages) > 20  # guards the guard
    assert sorted(p for p in packages if f"`{p}/`" not in table) == []
