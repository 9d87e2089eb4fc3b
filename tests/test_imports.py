"""Imports flow one way: tools, checkpoints <- nodes <- graph <- demo <- inbox <- cli (docs/architecture.md).

Two checks. Every module is imported first, alone, in a fresh interpreter: an import cycle fails there even when
the suite's own import order hides it (as `import gatedloop.nodes.validate` once failed while every test passed).
And every `gatedloop` import in the source, function-local and `TYPE_CHECKING` ones included, points to the same
package or a lower layer.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from doc_text import section

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"tools": 0, "checkpoints": 1, "nodes": 2, "graph": 3, "demo": 4, "inbox": 5, "cli": 6}


def package_dirs() -> dict[str, Path]:
    """`gatedloop.<package>` -> its folder, from pyproject's package-dir (the layout's one source of truth)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def modules() -> dict[str, Path]:
    """Every module of the installed package -> its file."""
    found: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def gatedloop_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a gatedloop module anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("gatedloop.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gatedloop."):
            found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, f"<relative import level {node.level}>"))
    return found


def test_every_package_has_a_layer():
    assert {name.split(".")[1] for name in package_dirs()} == set(LAYERS)


def test_imports_point_to_the_same_package_or_a_lower_layer():
    upward = []
    for module, path in modules().items():
        for line, target in gatedloop_imports(path):
            if not target.startswith("gatedloop.") or layer(target) > layer(module):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({module}) imports {target}")
    assert not upward, "imports that flow upward:\n" + "\n".join(upward)


NODES = {f"gatedloop.nodes.{name}" for name in ("model", "validate", "approve", "execute", "finalize")}


def test_the_gate_and_the_provider_adapters_never_import_a_node():
    """Inside `nodes`: the five nodes ask the gate (`nodes.gate`) and the provider adapters (`nodes.provider`);
    neither imports a node, so a node stays a thin reader of the state and writer of its update."""
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for module, path in modules().items()
        if module.startswith(("gatedloop.nodes.gate", "gatedloop.nodes.provider"))
        for line, target in gatedloop_imports(path)
        if target in NODES
    ]
    assert not upward, "\n".join(upward)


def names_used(path: Path) -> set[str]:
    """Every name a module imports or calls by name (`from x import name`, `name(...)`, `x.name(...)`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Call):
            func = node.func
            found.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return found


def test_who_is_calling_is_read_in_one_place_and_the_running_step_in_one_module():
    """Issue 29/30: the runtime identity is read where a call enters (`graph/gated.py`) and bound to the message
    and the answer as data; no node reads who is running it. In the whole package, `get_config`/`get_runtime` (the
    running step's ambient facts) appear in `checkpoints/running_step.py` only."""
    readers = {
        module: names_used(path) & {"caller_context", "get_config", "get_runtime"} for module, path in modules().items()
    }
    identity = sorted(module for module, names in readers.items() if "caller_context" in names)
    ambient = sorted(module for module, names in readers.items() if names & {"get_config", "get_runtime"})
    assert identity == ["gatedloop.graph.gated"], identity
    assert ambient == ["gatedloop.checkpoints.running_step"], ambient


IMPORT_EACH_FIRST = """
import importlib, os, sys

# The third-party packages gatedloop builds on, loaded once: the ones every module needs, then each one a gatedloop
# module imports at its top level (argv[1], comma-separated). Each gatedloop module is then imported in a forked
# copy of this interpreter, where no gatedloop module is loaded yet (a fresh interpreter per module took ten times
# as long, and re-importing Starlette, aiosqlite or psycopg in each fork took two thirds of what was left).
import langchain_core.language_models, langchain_core.messages, langchain_core.tools, langgraph.graph, pydantic

for name in filter(None, sys.argv[1].split(",")):
    try:
        importlib.import_module(name)
    except ImportError:  # an optional extra not installed: the module needing it reports it below
        pass
assert not [name for name in sys.modules if name.startswith("gatedloop")]
for module in sys.argv[2:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException as exc:
            print(f"{module}: {type(exc).__name__}: {exc}", flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status and os.WEXITSTATUS(status) != 1:
        print(f"{module}: exit status {status}", flush=True)
"""


def top_level_imports(path: Path) -> set[str]:
    """The modules outside gatedloop that a module imports when it is imported: at its top level or in a class
    body, not inside a function or under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try | ast.ClassDef | ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return {name for name in found if name.split(".")[0] not in ("gatedloop", "__future__")}


def _import_each_first(batch: list[str], preload: list[str]) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, ",".join(preload), *batch],
        cwd=ROOT.parent,  # not the repo root, so the folders there cannot stand in for the installed package
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_every_module_imports_first_in_a_fresh_interpreter():
    found = modules()
    names = sorted(found)
    workers = min(2, os.cpu_count() or 1)
    batches = [names[i::workers] for i in range(workers)]
    # Parsed here, not in the pool's threads: Python 3.11's ast.parse is not safe to run in two threads at once
    # ("SystemError: AST constructor recursion depth mismatch").
    preloads = [sorted(set().union(*(top_level_imports(found[name]) for name in batch))) for batch in batches]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        failures = [line for lines in pool.map(_import_each_first, batches, preloads) for line in lines]
    assert not failures, "modules that cannot be imported first:\n" + "\n".join(failures)


def test_the_documented_layer_diagram_is_the_order_this_test_enforces():
    text = section("Architecture")
    diagram = text[text.index("```\n") + 4 : text.index("```", text.index("```\n") + 4)]
    drawn = [line.split()[0] for line in diagram.splitlines() if line[:1].isalpha()]  # indented: continued
    assert list(reversed(drawn)) == sorted(LAYERS, key=LAYERS.__getitem__)


def test_one_import_gives_a_user_everything_including_the_postgres_openers():
    """`from gatedloop.graph import ...` is the documented path: each name is the object from its home module."""
    import gatedloop.graph as public
    from gatedloop.checkpoints import lease, postgres, sqlite
    from gatedloop.nodes.wire import hitl

    assert public.ThreadBusy is lease.ThreadBusy and public.InvalidDecision is hitl.InvalidDecision
    assert public.open_sqlite is sqlite.open_sqlite
    assert public.open_postgres is postgres.open_postgres  # loaded on first use (the postgres extra)
    assert public.open_async_postgres is postgres.open_async_postgres
    assert all(hasattr(public, name) for name in public.__all__)
    with pytest.raises(AttributeError, match="no attribute 'open_mysql'"):
        _ = public.open_mysql


WIRE_KEYS = {"action_requests", "review_configs", "allowed_decisions", "justification_required", "edited_action"}
"""The keys of gatedloop's interrupts and answers (`GatedHITLRequest`, `UnknownOutcomeRequest`, a decision)."""


def wire_key_reads(path: Path) -> list[tuple[int, str]]:
    """(line, key) for every `x["key"]` or `x.get("key")` of a wire key in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        key: Any = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        if key in WIRE_KEYS:
            found.append((node.lineno, str(key)))
    return found


def test_only_the_operator_layer_reads_a_pending_request_by_its_keys():
    """Issue 32: the CLI, the inbox and Slack read a pending request through `gatedloop.graph.pending` (parsed once,
    answers built there); only it and the gate that writes and checks the wire format (`gatedloop.nodes`) use its
    keys, so a new decision type touches that layer and the front ends' templates, not every front end."""
    readers = [
        f"{path.relative_to(ROOT)}:{line} reads {key!r}"
        for module, path in modules().items()
        if not module.startswith("gatedloop.nodes") and module != "gatedloop.graph.pending"
        for line, key in wire_key_reads(path)
    ]
    assert not readers, "\n".join(readers)


PUBLIC = ("gatedloop.graph", "gatedloop.tools", "gatedloop.tools.mcp", "gatedloop.checkpoints", "gatedloop.demo")
"""What a user's code imports (docs/api.md, docs/use.md): `gatedloop.graph` and its modules, the tools and
checkpoints packages' own names, the MCP adapter, the built-in demo."""


def user_code_imports() -> list[tuple[str, str]]:
    """(where, module) of every gatedloop import in the notebooks, the examples and the tutorial."""
    import json

    found = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell.get("source") or []) if cell.get("cell_type") == "code" else ""
            found += [(notebook.name, m) for _, m in _imports_in(source, notebook.name)]
    for path in sorted((ROOT / "examples").rglob("*.py")):
        if "build" not in path.parts and ".egg-info" not in str(path):
            found += [(str(path.relative_to(ROOT)), m) for _, m in _imports_in(path.read_text(), str(path))]
    return found


def _imports_in(source: str, where: str) -> list[tuple[int, str]]:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines), where)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gatedloop"):
            found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gatedloop")]
    return found


def test_the_notebooks_and_examples_import_only_public_modules():
    """Issue 30: what users copy imports what is documented, never the gate's or the savers' insides."""
    imported = user_code_imports()
    assert len(imported) > 10, "no imports found: the scan lost its files"
    inner = [
        f"{where}: {module}"
        for where, module in imported
        if not (module in PUBLIC or module.startswith(("gatedloop.graph.", "gatedloop.demo.")))
    ]
    assert not inner, "\n".join(inner)


INSIDE_NODES = {
    "base": ("state", "limits"),
    "wire": ("wire",),
    "gate": ("gate",),
    "provider": ("provider",),
    "parts": ("build",),
    "run": ("run",),
    "nodes": ("model", "validate", "approve", "execute", "finalize", ""),
}
"""docs/architecture.md "Inside nodes/": each layer and the modules (or subpackages) of `gatedloop.nodes` in it,
lowest first ("" is the package's own `__init__`)."""


def inner_layer(module: str) -> int:
    head = module.split(".")[2] if module.count(".") >= 2 else ""
    found = [i for i, heads in enumerate(INSIDE_NODES.values()) if head in heads]
    assert found, f"{module} is in no layer of INSIDE_NODES (docs/architecture.md, 'Inside nodes/')"
    return found[0]


def test_imports_inside_nodes_point_to_the_same_layer_or_a_lower_one():
    """Issue 30: the gate imports neither the tool runner (nodes/run), nor the provider adapters, nor the
    dependency bag (nodes/build/parts.py), nor a node; the runner does not import a node."""
    nodes = {m: p for m, p in modules().items() if m.startswith("gatedloop.nodes")}
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for module, path in nodes.items()
        for line, target in gatedloop_imports(path)
        if target.startswith("gatedloop.nodes") and inner_layer(target) > inner_layer(module)
    ]
    assert not upward, "\n".join(upward)
    assert {inner_layer(m) for m in nodes} == set(range(len(INSIDE_NODES))), "a layer with no module"


def test_the_drawing_inside_nodes_is_the_order_this_test_enforces():
    text = section("Inside nodes/")
    diagram = text[text.index("```\n") + 4 : text.index("```", text.index("```\n") + 4)]
    drawn = [line.split()[0] for line in diagram.splitlines() if line[:1].isalpha()]
    assert list(reversed(drawn)) == list(INSIDE_NODES)


def ledger_calls(path: Path) -> list[tuple[int, str]]:
    """(line, method) for every call of a method on something named `ledger` (`parts.ledger.record(...)`,
    `ledger.calls(...)`) in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            if name == "ledger":
                found.append((node.lineno, node.func.attr))
    return found


def test_no_node_calls_the_ledger_it_asks_the_gate():
    """Issue 30: the five nodes read the state, ask the gate and return the update. Reading and writing evidence is
    the gate's (and the runner's), so a review of what a node may record is a review of nodes/gate and nodes/run."""
    paths = modules()
    calls = [
        f"{paths[module].relative_to(ROOT)}:{line} calls ledger.{method}"
        for module in sorted(NODES)
        for line, method in ledger_calls(paths[module])
    ]
    assert not calls, "\n".join(calls)
    gate_calls = [m for m, p in paths.items() if m.startswith("gatedloop.nodes.gate") and ledger_calls(p)]
    assert "gatedloop.nodes.gate.approvals" in gate_calls, "the scan finds no ledger call at all: it lost its way"


WITHOUT_LANGCHAIN = """
import sys
sys.modules["langchain"] = None  # as in an install without the `middleware` extra (Aegra's venv, the quick start)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from gatedloop.graph import ToolPolicy, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

@tool
def look(q: str) -> str:
    '''Look something up.'''
    return "found"

model = ScriptedChatModel(script=[reply(calls=[call("look", {"q": "x"}, "c1")]), reply("done")])
graph = build_graph(model, [look], policies={"look": ToolPolicy(effect="read", approval="never")},
                    checkpointer=InMemorySaver())
out = graph.invoke({"messages": [("user", "look")]}, {"configurable": {"thread_id": "t"}})
assert out["status"] == "completed", out
"""


def test_a_graph_without_middleware_runs_a_tool_without_the_langchain_package():
    """`langchain` is an extra (`middleware`): a graph without middleware, served from a venv without it, must load
    and run its tools (a module-level import of LangChain's composition once stopped Aegra from loading any graph)."""
    ran = subprocess.run([sys.executable, "-c", WITHOUT_LANGCHAIN], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
