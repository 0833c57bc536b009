"""DESIGN §3: imports point one way and each foreign library sits behind one module.

Every .py under the four packages is parsed (never imported), so a violation is
caught even in code no test runs: imports inside functions, `if TYPE_CHECKING:`
blocks, relative imports and `importlib.import_module("literal")` all count.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "net", "coordinator", "app")
QT = frozenset({"PySide6", "shiboken6"})
HEADLESS = ("app/cli.py", "app/worker.py", "app/client.py")
SERVER_LIBS = frozenset(
    {"fastapi", "uvicorn", "starlette", "pydantic", "pydantic_core", "sqlalchemy", "alembic"}
)
"""The coordinator server's libraries: under coordinator/ only coordinator/server uses them."""
BEYOND = "<beyond-top-level>"
"""Stands for a relative import with more dots than the file has packages above it."""


@dataclass(frozen=True)
class Import:
    module: str
    """Absolute dotted name, relative imports already resolved."""
    line: int

    @property
    def root(self) -> str:
        return self.module.split(".")[0]


@dataclass(frozen=True)
class Rule:
    applies: Callable[[str], bool]
    """Takes a path relative to the repository root, with forward slashes."""
    forbidden: frozenset[str]
    why: str


def under(*prefixes: str) -> Callable[[str], bool]:
    return lambda path: path.startswith(prefixes)


def outside(*allowed: str) -> Callable[[str], bool]:
    """Every file except those equal to, or under a folder in, `allowed`."""
    return lambda path: (
        not any(path == a or (a.endswith("/") and path.startswith(a)) for a in allowed)
    )


def both(*tests: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda path: all(test(path) for test in tests)


# The first rule an import breaks is the one reported, so specific reasons come first.
RULES = (
    Rule(lambda _: True, frozenset({BEYOND}), "relative import climbs above the top level"),
    Rule(
        under("core/"),
        frozenset({"net", "coordinator", "app", "asyncio"}) | QT,
        "core is the model alone: no wire, no coordinator, no app, no event loop, no Qt",
    ),
    Rule(
        under("net/"),
        frozenset({"core", "coordinator", "app"}) | QT,
        "net carries bytes and small headers; it knows nothing of the model or the UI",
    ),
    Rule(under("coordinator/"), frozenset({"app"}) | QT, "the coordinator is a headless service"),
    Rule(
        under("coordinator/client/"),
        frozenset({"coordinator.server"}) | SERVER_LIBS,
        "coordinator/client runs on volunteer PCs: it speaks HTTP with requests and builds "
        "its messages from coordinator.contract, never from the server or its libraries",
    ),
    Rule(
        under("coordinator/server/"),
        frozenset({"coordinator.client"}),
        "the coordinator server does not use the volunteers' client; both build on contract",
    ),
    Rule(
        both(under("coordinator/"), outside("coordinator/server/", "coordinator/client/")),
        frozenset({"coordinator.server", "coordinator.client"}) | SERVER_LIBS,
        "coordinator's shared modules (contract, errors, invites) know neither end",
    ),
    Rule(
        # The lab and operator commands really run a coordinator: `sangama coordinator` and
        # `sangama invite` (cli_swarm) serve it and use its rules; the loopback demo swarm
        # (demo_swarm) starts one and reads its admin token file. Nothing else in app may.
        both(under("app/"), outside("app/cli_swarm.py", "app/demo_swarm.py")),
        frozenset({"coordinator.server"}),
        "app runs on volunteer PCs: it may use coordinator.client and coordinator.contract, "
        "never coordinator.server (only app/cli_swarm.py and app/demo_swarm.py run a "
        "coordinator server)",
    ),
    Rule(
        outside("coordinator/server/"),
        frozenset({"sqlalchemy", "alembic"}),
        "SQLAlchemy and Alembic live only in coordinator/server (the coordinator's storage)",
    ),
    Rule(
        outside("core/llama_engine.py", "core/backends.py"),
        frozenset({"llama_cpp"}),
        "llama_cpp lives only in core/llama_engine.py and core/backends.py (its libraries)",
    ),
    Rule(outside("net/quic.py"), frozenset({"aioquic"}), "aioquic lives only in net/quic.py"),
    Rule(
        outside("app/ui/", "app/controllers.py"),
        QT,
        "Qt lives only in app/ui/ and app/controllers.py; servers run headless",
    ),
)


def module_name(path: str) -> str:
    """'core/x.py' -> 'core.x'; 'app/ui/__init__.py' -> 'app.ui'."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: str, source: str) -> list[Import]:
    """Every module `source` (the file at `path`) imports, anywhere in its body."""
    package = module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        found.extend(_imports_in(node, package))
    return found


def _imports_in(node: ast.AST, package: list[str]) -> Iterator[Import]:
    if isinstance(node, ast.Import):
        yield from (Import(alias.name, node.lineno) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(node.module, node.level, package)
        yield Import(base, node.lineno)
        # `from pkg import name` may import the submodule pkg.name: record it too.
        yield from (Import(f"{base}.{a.name}", node.lineno) for a in node.names if a.name != "*")
    elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            yield Import(arg.value, node.lineno)


def _resolve(module: str | None, level: int, package: list[str]) -> str:
    if level == 0:
        return module or ""
    if level - 1 >= len(package):
        return BEYOND
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _forbids(rule: Rule, imp: Import) -> bool:
    """A forbidden name is a top-level package ("fastapi") or a dotted subpackage
    ("coordinator.server", which also covers everything below it)."""
    return any(imp.module == f or imp.module.startswith(f + ".") for f in rule.forbidden)


def violations(path: str, imports: Iterable[Import]) -> list[str]:
    """One line per import statement that breaks a rule (reported under its first rule)."""
    found: dict[tuple[int, str], str] = {}
    for imp in sorted(imports, key=lambda i: (i.line, len(i.module))):
        rule = next((r for r in RULES if r.applies(path) and _forbids(r, imp)), None)
        if rule is not None:
            # `from net.wire import encode` yields net.wire and net.wire.encode: say it once.
            found.setdefault(
                (imp.line, rule.why), f"{path}:{imp.line}: imports {imp.module} ({rule.why})"
            )
    return list(found.values())


def qt_reachable(start: str, graph: dict[str, list[Import]]) -> list[str]:
    """One chain start -> ... -> Qt per project module that imports Qt and is reachable."""
    chains = []
    seen = {start}
    queue = deque([[start]])
    while queue:
        chain = queue.popleft()
        imports = graph.get(chain[-1], [])
        qt = next((i for i in imports if i.root in QT), None)
        if qt is not None:
            chains.append(" -> ".join([*chain, qt.module]))
        for imp in imports:
            for target in _project_modules(imp.module, graph):
                if target not in seen:
                    seen.add(target)
                    queue.append([*chain, target])
    return chains


def _project_modules(name: str, graph: dict[str, list[Import]]) -> list[str]:
    # Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c: each may pull in Qt.
    parts = name.split(".")
    return [m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in graph]


def project_sources() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for package in PACKAGES
        if (ROOT / package).is_dir()
        for p in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


# --- the real tree --------------------------------------------------------------------


def test_the_tree_is_parsed() -> None:
    sources = project_sources()
    assert "core/types.py" in sources  # guards against a wrong ROOT making the rest vacuous


def test_every_module_respects_the_import_rules() -> None:
    problems = [
        line
        for path, source in project_sources().items()
        for line in violations(path, imports_of(path, source))
    ]
    assert problems == [], "\n".join(problems)


def test_headless_entry_points_do_not_reach_qt_transitively() -> None:
    graph = {module_name(p): imports_of(p, s) for p, s in project_sources().items()}
    chains = [c for path in HEADLESS for c in qt_reachable(module_name(path), graph)]
    assert chains == [], "\n".join(chains)


# --- the checker itself -----------------------------------------------------------------


def test_checker_resolves_relative_imports_inside_functions() -> None:
    source = "def f():\n    from ..net import wire\n    from . import stage\n"
    modules = {i.module for i in imports_of("core/engine/x.py", source)}
    assert modules == {"core.net", "core.net.wire", "core.engine", "core.engine.stage"}


def test_checker_flags_relative_imports_above_the_top_level() -> None:
    problems = violations("core/x.py", imports_of("core/x.py", "from .. import net\n"))
    assert problems == [
        "core/x.py:1: imports <beyond-top-level> (relative import climbs above the top level)"
    ]


def test_checker_resolves_package_relative_imports() -> None:
    modules = {i.module for i in imports_of("app/ui/__init__.py", "from .. import worker\n")}
    assert modules == {"app", "app.worker"}


def test_checker_flags_a_core_module_reaching_into_net() -> None:
    source = "import numpy\n\ndef send():\n    from net.wire import encode\n"
    problems = violations("core/stage.py", imports_of("core/stage.py", source))
    assert len(problems) == 1
    assert problems[0].startswith("core/stage.py:4: imports net.wire")


def test_checker_flags_asyncio_and_dynamic_llama_cpp_in_core() -> None:
    source = "import asyncio\nimport importlib\nm = importlib.import_module('llama_cpp')\n"
    problems = violations("core/tokenizer.py", imports_of("core/tokenizer.py", source))
    assert [p.split(" (")[0] for p in problems] == [
        "core/tokenizer.py:1: imports asyncio",
        "core/tokenizer.py:3: imports llama_cpp",
    ]


def test_checker_allows_each_library_in_its_own_module_only() -> None:
    def broken(path: str, source: str) -> bool:
        return bool(violations(path, imports_of(path, source)))

    assert not broken("core/llama_engine.py", "import llama_cpp\n")
    assert broken("core/stage.py", "from llama_cpp import llama_cpp\n")
    assert not broken("net/quic.py", "from aioquic.asyncio import serve\n")
    assert broken("net/links.py", "import aioquic\n")
    assert not broken("app/ui/chat.py", "from PySide6.QtWidgets import QWidget\n")
    assert not broken("app/controllers.py", "from PySide6.QtCore import QObject\n")
    assert broken("app/cli.py", "from PySide6.QtCore import QObject\n")
    assert broken("app/worker.py", "def f():\n    import PySide6\n")
    assert broken("coordinator/server/api.py", "from app import settings\n")
    assert not broken("coordinator/server/api.py", "from core.types import LayerRange\n")


def test_checker_keeps_the_coordinator_server_apart_from_volunteer_code() -> None:
    def broken(path: str, source: str) -> bool:
        return bool(violations(path, imports_of(path, source)))

    assert not broken("coordinator/server/api.py", "from fastapi import FastAPI\n")
    assert not broken("coordinator/server/store.py", "import sqlalchemy\nimport alembic\n")
    assert broken("coordinator/client/session.py", "from fastapi import FastAPI\n")
    assert broken("coordinator/client/session.py", "import sqlalchemy\n")
    assert broken("coordinator/client/session.py", "from coordinator.server import store\n")
    assert broken("coordinator/contract.py", "import pydantic\n")
    assert broken("coordinator/contract.py", "from coordinator import client\n")
    assert broken("coordinator/server/api.py", "from coordinator.client.session import join\n")
    assert not broken("coordinator/client/session.py", "from coordinator.contract import Route\n")
    assert not broken("app/identity.py", "from coordinator.client.session import join\n")
    assert broken("app/identity.py", "from coordinator.server.store import Store\n")
    assert broken("app/coordinated.py", "def f():\n    import coordinator.server.api\n")
    assert not broken("app/cli_swarm.py", "from coordinator.server.serve import serve\n")
    assert not broken("app/demo_swarm.py", "from coordinator.server.serve import serve\n")
    assert broken("app/settings.py", "import sqlalchemy\n")


def test_transitive_check_finds_qt_behind_a_project_import() -> None:
    sources = {
        "app/__init__.py": "",
        "app/cli.py": "from app import worker\n",
        "app/worker.py": "from .controllers import Bridge\n",
        "app/controllers.py": "from PySide6.QtCore import QObject\n",
    }
    graph = {module_name(p): imports_of(p, s) for p, s in sources.items()}
    assert qt_reachable("app.cli", graph) == [
        "app.cli -> app.worker -> app.controllers -> PySide6.QtCore"
    ]
