"""Imports point one way and each foreign library sits behind its own modules: the
rules of docs/architecture.md ("What may import what"), checked.

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
SERVER_LIBS = frozenset(
    {"fastapi", "uvicorn", "starlette", "pydantic", "pydantic_core", "sqlalchemy", "alembic"}
)
"""The coordinator server's libraries: under coordinator/ only coordinator/server uses them."""
WEB_LIBS = frozenset({"fastapi", "uvicorn", "starlette", "pydantic", "pydantic_core"})
"""HTTP servers and their models: the coordinator's API and the OpenAI-compatible API."""
SQL_LIBS = frozenset({"sqlalchemy", "alembic"})
QUIC_LIBS = frozenset({"aioquic", "qh3"})
APP_ROLES = ("serving", "client", "api", "cli", "lab", "ui")
"""app's role packages; the modules directly in app/, with app/links and app/session, are
the shared base under them all."""
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


def _matches(path: str, allowed: str) -> bool:
    """`allowed` is a file ("net/quic/links.py"), a folder ("app/ui/") or a prefix ("app/x*")."""
    if allowed.endswith("*"):
        return path.startswith(allowed[:-1])
    return path == allowed or (allowed.endswith("/") and path.startswith(allowed))


def outside(*allowed: str) -> Callable[[str], bool]:
    """Every file except those `allowed` (files, folders ending in /, prefixes ending in *)."""
    return lambda path: not any(_matches(path, a) for a in allowed)


def both(*tests: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda path: all(test(path) for test in tests)


APP_BASE_PACKAGES = ("links", "session")
"""app's shared packages: reaching peers, and the session protocol client and stages share."""


def in_app_base(path: str) -> bool:
    """A module of app's shared base (identity, config, links/, session/, ...), not a role."""
    if not path.startswith("app/"):
        return False
    return path.count("/") == 1 or path.split("/")[1] in APP_BASE_PACKAGES


def roles(*names: str) -> frozenset[str]:
    return frozenset(f"app.{n}" for n in names)


# The first rule an import breaks is the one reported, so specific reasons come first.
# docs/architecture.md ("What may import what") states each of these in words.
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
    Rule(
        under("net/wire/", "net/auth/"),
        frozenset({"asyncio", "socket", "net.quic", "net.ice", "net.channel"})
        | QUIC_LIBS
        | frozenset({"aioice"}),
        "net/wire (frames and their bytes) and net/auth (certificates and proofs) do no IO: "
        "no event loop, no sockets, no links",
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
        # `sangama invite` (swarm_commands) serve it and use its rules; the loopback demo
        # swarm (demo_swarm) starts one and reads its admin token file. Nothing else in app may.
        both(under("app/"), outside("app/cli/swarm_commands.py", "app/lab/demo_swarm.py")),
        frozenset({"coordinator.server"}),
        "app runs on volunteer PCs: it may use coordinator.client and coordinator.contract, "
        "never coordinator.server (only app/cli/swarm_commands.py and app/lab/demo_swarm.py "
        "run a coordinator server)",
    ),
    Rule(
        both(under("app/"), outside("app/cli/", "app/lab/")),
        roles("lab"),
        "app.lab (loopback demos and swarms) is imported only by app/cli, bench/ and tests/: "
        "nothing a volunteer runs depends on it",
    ),
    Rule(
        in_app_base,
        roles(*APP_ROLES),
        "modules directly in app/ (and app/links, app/session) are the shared base: they "
        "import none of app's role packages (serving, client, api, cli, lab, ui)",
    ),
    Rule(
        under("app/serving/"),
        roles("client", "api", "cli", "ui"),
        "app/serving runs a stage: it builds on app's base, never on the client, the API, "
        "the CLI or the desktop",
    ),
    Rule(
        under("app/client/"),
        roles("serving", "api", "cli", "ui"),
        "app/client asks the swarm: it builds on app's base, never on serving, the API, "
        "the CLI or the desktop",
    ),
    Rule(
        under("app/api/"),
        roles("serving", "cli", "ui"),
        "app/api serves the OpenAI-compatible API on app.client: never serving, the CLI "
        "or the desktop",
    ),
    Rule(
        under("app/cli/", "app/lab/"),
        roles("ui"),
        "the CLI and the lab are headless: they never import the desktop app (app/ui)",
    ),
    Rule(
        under("app/ui/"),
        roles("cli"),
        "the desktop app drives serving, client and API directly, never through the CLI",
    ),
    Rule(
        outside("coordinator/server/", "app/api/"),
        WEB_LIBS,
        "FastAPI, uvicorn, Starlette and pydantic live only in coordinator/server (the "
        "coordinator's API) and app/api (the OpenAI-compatible API)",
    ),
    Rule(
        outside(
            "coordinator/server/store.py",
            "coordinator/server/service.py",
            "coordinator/server/invite_book.py",
            "coordinator/server/migrations/",
        ),
        SQL_LIBS,
        "SQLAlchemy and Alembic live only in the coordinator's storage (coordinator/server: "
        "store, migrations/, and the service and invite book that run its queries)",
    ),
    Rule(
        outside("core/llama_engine.py", "core/llama_mtp.py", "core/backends.py"),
        frozenset({"llama_cpp"}),
        "llama_cpp lives only in core/llama_engine.py, core/llama_mtp.py and "
        "core/backends.py (its libraries)",
    ),
    Rule(
        outside("net/quic/"),
        QUIC_LIBS,
        "the QUIC libraries (aioquic, qh3) live only in net/quic/",
    ),
    Rule(outside("net/ice/"), frozenset({"aioice"}), "aioice lives only in net/ice/"),
    Rule(
        outside("app/ui/"),
        QT,
        "Qt lives only in app/ui/ (widgets and their controllers); everything else runs headless",
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


def test_nothing_outside_app_ui_reaches_qt_transitively() -> None:
    graph = {module_name(p): imports_of(p, s) for p, s in project_sources().items()}
    headless = [m for m in graph if m != "app.ui" and not m.startswith("app.ui.")]
    chains = [c for module in headless for c in qt_reachable(module, graph)]
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
    assert not broken("net/quic/links.py", "from aioquic.asyncio import serve\n")
    assert broken("net/links.py", "import aioquic\n")
    assert not broken("app/ui/chat.py", "from PySide6.QtWidgets import QWidget\n")
    assert not broken("app/ui/controllers.py", "from PySide6.QtCore import QObject\n")
    assert broken("app/cli/main.py", "from PySide6.QtCore import QObject\n")
    assert broken("app/serving/worker.py", "def f():\n    import PySide6\n")
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
    assert broken("app/serving/coordinated.py", "def f():\n    import coordinator.server.api\n")
    assert not broken("app/cli/swarm_commands.py", "from coordinator.server.serve import serve\n")
    assert not broken("app/lab/demo_swarm.py", "from coordinator.server.serve import serve\n")
    assert broken("app/ui/settings.py", "import sqlalchemy\n")


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


def _reason(path: str, source: str) -> list[str]:
    """The reason (the text in parentheses) of each violation `source` at `path` makes."""
    return [p.split(" (", 1)[1] for p in violations(path, imports_of(path, source))]


@pytest.mark.parametrize(
    ("path", "source", "reason"),
    [
        ("app/serving/worker.py", "from app.lab import demo\n", "app.lab (loopback"),
        ("app/api/openai_serve.py", "from app.lab.local_swarm import x\n", "app.lab (loopback"),
        ("app/ui/tray.py", "from app.lab import demo\n", "app.lab (loopback"),
        ("app/identity.py", "from app.serving.worker import StageWorker\n", "modules directly"),
        (
            "app/links/paths.py",
            "def f():\n    from app.client import connect\n",
            "modules directly",
        ),
        ("app/serving/coordinated.py", "from app.client.route import x\n", "app/serving runs"),
        ("app/serving/serve.py", "from app.api import openai_api\n", "app/serving runs"),
        ("app/client/connect.py", "from app.serving.worker import x\n", "app/client asks"),
        ("app/client/route.py", "from app.api.openai_api import x\n", "app/client asks"),
        ("app/api/openai_serve.py", "from app.serving import serve\n", "app/api serves"),
        ("app/api/openai_api.py", "from app.cli.main import main\n", "app/api serves"),
        ("app/cli/main.py", "from app.ui.tray import run_app\n", "the CLI and the lab"),
        ("app/lab/demo.py", "from app.ui import controllers\n", "the CLI and the lab"),
        ("app/ui/tray.py", "from app.cli.main import main\n", "the desktop app drives"),
        ("app/serving/serve.py", "import uvicorn\n", "FastAPI, uvicorn"),
        ("app/client/swarm_client.py", "from pydantic import BaseModel\n", "FastAPI, uvicorn"),
        ("core/stage.py", "import fastapi\n", "FastAPI, uvicorn"),
        ("coordinator/server/placement/plan.py", "import sqlalchemy\n", "SQLAlchemy and"),
        ("coordinator/server/api.py", "from alembic import command\n", "SQLAlchemy and"),
        ("app/lab/demo_swarm.py", "import sqlalchemy\n", "SQLAlchemy and"),
        ("net/channel.py", "import qh3\n", "the QUIC libraries"),
        ("net/links.py", "from aioquic.quic import events\n", "the QUIC libraries"),
        ("net/channel.py", "import aioice\n", "aioice lives"),
        ("app/links/paths.py", "from aioice import Candidate\n", "aioice lives"),
        ("app/serving/worker.py", "from shiboken6 import isValid\n", "Qt lives only"),
        ("app/cli/main.py", "import llama_cpp\n", "llama_cpp lives"),
    ],
)
def test_checker_flags_each_rule(path: str, source: str, reason: str) -> None:
    reasons = _reason(path, source)
    assert reasons, f"{path}: {source!r} should break a rule"
    assert all(r.startswith(reason) for r in reasons), reasons


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("app/cli/main.py", "from app.lab.demo import run_demo\n"),
        ("app/lab/demo.py", "from app.api.openai_serve import serve_api\n"),
        ("app/lab/local_swarm.py", "from app.serving.serve import run_worker\n"),
        ("app/api/openai_serve.py", "from app.client.connect import joined_links\n"),
        ("app/ui/controllers.py", "from app.serving.coordinated import serve_coordinated\n"),
        ("app/ui/tray.py", "from app.client.connect import identity_connector\n"),
        ("app/serving/coordinated.py", "from app.ports import free_udp_port\n"),
        ("app/api/openai_api.py", "from fastapi import FastAPI\nimport pydantic\n"),
        ("coordinator/server/migrations/env.py", "from alembic import context\n"),
        ("net/quic/links.py", "import aioquic\nimport qh3\n"),
        ("net/quic/tuning.py", "import aioquic\n"),
        ("net/ice/values.py", "from aioice import Candidate\n"),
        ("core/backends.py", "import llama_cpp\n"),
    ],
)
def test_checker_allows_what_the_document_allows(path: str, source: str) -> None:
    assert _reason(path, source) == []
