"""The import rule of docs/ARCHITECTURE.md, enforced by walking the source (no imports run).

- ``gpu_worker`` (the executor, on GPU machines) imports no Django and no other trainhub package.
- ``providers`` (adapters) imports neither ``jobs`` nor ``trainhub``; Django only lazily, for
  settings inside an adapter factory.
- ``jobs/services`` is layered: a service module imports only modules of lower layers.
- No import inside a function body in ``jobs/services`` unless a comment on its line says why.
- No circle of modules in ``jobs``, ``providers`` or ``gpu_worker`` (imports inside functions
  count).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. A module may import modules of the layers below its own, never above or beside.
SERVICE_LAYERS: list[tuple[str, set[str]]] = [
    ("celery messages", {"messages"}),
    # What storing an event sets off once it commits: the live stream, the webhook outbox.
    ("publishing", {"live", "webhook_outbox"}),
    # The audit trail's writer: every state-changing service above records through it.
    ("audit trail", {"audit"}),
    (
        "foundations",
        {"events", "costs", "projects", "specs", "webhooks", "job_request", "webhook_endpoints"},
    ),
    (
        "job status and node identity",
        {"status", "nodes", "retention", "targets", "webhook_delivery", "notifications"},
    ),
    ("attempts and offers", {"attempts", "offers"}),
    ("lifecycles", {"jobs", "dispatch", "remote", "stopping", "artifacts", "reconcile"}),
    ("after launch", {"polling", "files"}),
    ("launch", {"launch"}),
    ("placement", {"placement"}),
]
# Lazy imports across a package rule, each with its reason.
ALLOWED_LAZY = {
    # The limiter shares the control plane's Redis connection; adapters run only there.
    ("providers.ratelimit", "jobs.locks"),
}


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


def test_gpu_worker_imports_no_django_and_no_control_plane() -> None:
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in package_imports("gpu_worker")
        if top(i.target) in {"django", "rest_framework", "jobs", "providers", "trainhub"}
    ]
    assert bad == []


def test_providers_import_neither_jobs_nor_trainhub_and_django_only_lazily() -> None:
    bad = []
    for i in package_imports("providers"):
        crosses = top(i.target) in {"jobs", "trainhub"}
        if crosses and (i.source, i.target) not in ALLOWED_LAZY:
            bad.append(f"{i.source}:{i.line} imports {i.target}")
        if top(i.target) == "django" and not i.in_function:
            bad.append(f"{i.source}:{i.line} imports {i.target} at module level")
    assert bad == []


def test_every_service_module_has_a_layer() -> None:
    layered = set().union(*(modules for _, modules in SERVICE_LAYERS))
    present = {p.stem for p in (ROOT / "jobs" / "services").glob("*.py")} - {"__init__"}
    assert present == layered, "add new service modules to SERVICE_LAYERS (and ARCHITECTURE.md)"


def test_services_import_only_lower_layers() -> None:
    layer_of = {m: n for n, (_, modules) in enumerate(SERVICE_LAYERS) for m in modules}
    bad = []
    for i in package_imports("jobs/services"):
        source, target = i.source.rsplit(".", 1)[-1], i.target
        if not target.startswith("jobs.services.") or source == "__init__":
            continue
        imported = target.removeprefix("jobs.services.").split(".")[0]
        if layer_of[imported] >= layer_of[source]:
            bad.append(
                f"{i.source}:{i.line} imports {imported} "
                f"({SERVICE_LAYERS[layer_of[imported]][0]}, not below "
                f"{SERVICE_LAYERS[layer_of[source]][0]})"
            )
    assert bad == []


def test_no_unexplained_import_inside_a_service_function() -> None:
    bad = [
        f"{i.source}:{i.line} imports {i.target} inside a function"
        for i in package_imports("jobs/services")
        if i.in_function and not i.commented
    ]
    assert bad == []


@pytest.mark.parametrize("package", ["jobs", "providers", "gpu_worker"])
def test_no_circle_of_modules(package: str) -> None:
    """Counting imports inside functions: a package's __init__ may import its modules, but
    then none of them may import the package back."""
    graph: dict[str, set[str]] = {}
    for i in package_imports(package):
        if top(i.target) == package and i.target != i.source:
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


@pytest.mark.parametrize("package", ["gpu_worker", "providers", "jobs/services"])
def test_the_walk_sees_imports(package: str) -> None:
    """Guards the guard: a walk that found nothing would pass every rule above."""
    assert len(package_imports(package)) > 20
