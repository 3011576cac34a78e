"""The client imports nothing of the server: no Django, ``jobs``, ``trainhub``, ``providers``
(nor ``gpu_worker``, which is not installed with it), checked on the source (nothing is run)."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "trainhub_cli"
FORBIDDEN = {
    "django",
    "rest_framework",
    "jobs",
    "trainhub",
    "providers",
    "gpu_worker",
    "devsupport",
    "tests",
}


def test_the_cli_imports_nothing_of_the_server() -> None:
    found = []
    for path in sorted(CLI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN
            ]
    assert not found, "trainhub_cli must stay a plain HTTP client:\n" + "\n".join(found)
    assert len(list(CLI.rglob("*.py"))) > 5  # the walk saw the package
