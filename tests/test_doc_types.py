"""The docs' Python type-checks as a user's mypy would check it (issue 54: "type hints that reject code written as
the docs write it"). Every ```python block of README.md and docs/*.md (the tutorial's included files as they are)
goes to one mypy run with default settings, against this checkout of the package: mypy's own defaults, not the
repository's configuration (whose pydantic plugin hid `Limits(max_model_calls=8)` being refused), and errors
inside gatedloop silenced as they are for an installed package.

A block continues the page around it, so it may use a name the page defined before (`model`, `tools`, `graph`,
`saver`...): `GIVEN` declares those as a user's code would have them. What it found, fixed in the hints:
`Limits(...)` (pydantic `Field(12, ...)` is no default to a type checker without pydantic's plugin),
`CallContext(roles={"finance"})` and `ToolPolicy(approvers={...}, limits=[...])` (a set or a list for a frozenset
or tuple field), `build_graph(...)` typed with no context, so `graph.invoke(..., context=...)` was refused, and
`PendingRequest.parse(runs.pending_request(...))` (which may be None). LangGraph's and langgraph-sdk's own hints
refuse a config kept in a plain dict and nested JSON literals: the docs annotate those.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from doc_text import ROOT, pages

PACKAGE_DIRS = ("graph", "nodes", "tools", "checkpoints", "cli", "inbox", "demo")
BLOCK = re.compile(r"^```(?:python|py)[^\n]*\n(.*?)^```", re.S | re.M)
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
GIVEN = '''"""Names the docs' blocks use from the page around them, typed as a user's code would have them."""
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.memory import InMemoryStore as InMemoryStore
from langgraph_sdk.client import SyncLangGraphClient
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel

from gatedloop.graph import CallContext, ToolPolicy, build_graph

model: BaseChatModel
tools: list[BaseTool]
policies: dict[str, ToolPolicy]
saver: BaseCheckpointSaver[Any]
graph = build_graph(model, tools, policies=policies, checkpointer=saver)
cfg: RunnableConfig
thread_id: str
bo: CallContext
client: SyncLangGraphClient
request: dict[str, Any]
refund_call_id: str
tracer_provider: TracerProvider
meter_provider: MeterProvider
my_stricter_pay_policy: ToolPolicy


class Booking(BaseModel):
    table: str
'''

GIVEN_NAMES = (
    *("model", "tools", "policies", "saver", "graph", "cfg", "thread_id", "bo", "client", "request"),
    *("refund_call_id", "tracer_provider", "meter_provider", "my_stricter_pay_policy", "Booking"),
    *("build_graph", "CallContext", "InMemoryStore"),
)


def python_blocks() -> dict[str, str]:
    """Module name -> source: each block that is one whole-file include as that file (the tutorial's step files
    import `agent` beside them), every other block after `from given import *`."""
    found: dict[str, str] = {}
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for block in BLOCK.finditer(text):
            body = block.group(1)
            line = text[: block.start()].count("\n") + 1
            include = INCLUDE.match(body.strip())
            if include:
                path = ROOT / include.group("path")
                assert path.is_file(), f"{page.name}:{line} includes {path}, which does not exist"
                found[path.stem] = path.read_text(encoding="utf-8")
            else:
                assert "--8<--" not in body, f"{page.name}:{line}: an include inside other code is not handled here"
                found[f"doc_{page.stem.lower()}_{line}"] = given_names(body) + body
    return found


def given_names(body: str) -> str:
    """The import of the names of `GIVEN` a block uses without binding them itself (`name = ...`, as formatted,
    where a keyword argument is `name=...`; a block's own `client` may be another client, and annotating a name
    imported would be a redefinition)."""
    names = [
        name
        for name in GIVEN_NAMES
        if re.search(rf"\b{name}\b", body)
        and not re.search(rf"^\s*{name}(?::[^=\n]*)? = |\bimport\b.*\b{name}\b", body, re.M)
    ]
    imports = ", ".join(dict.fromkeys(["Any", *names]))
    return f"from given import {imports}  # noqa\n"


def mypy_cache() -> Path:
    """Kept between runs (mypy checks that a cached module is current): a cold run reads LangGraph and the package
    for about 25 s, a warm one takes a few."""
    return Path(tempfile.gettempdir()) / f"gatedloop-doc-types-mypy-{os.getuid()}"


def run_mypy(folder: Path, modules: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One mypy run over `modules`, default settings, gatedloop read from this checkout (its package layout made
    of links to the repository's folders, as the editable install maps them)."""
    package = folder / "site" / "gatedloop"
    package.mkdir(parents=True)
    for name in PACKAGE_DIRS:
        (package / name).symlink_to(ROOT / name)
    code = folder / "code"
    code.mkdir()
    (code / "given.py").write_text(GIVEN, encoding="utf-8")
    for name, source in modules.items():
        (code / f"{name}.py").write_text(source, encoding="utf-8")
    (folder / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    # errors in gatedloop itself are not the user's (an installed package's never show); a top-level `await` is
    # how docs/use.md shows an async call in a notebook
    quiet = ["--follow-imports=silent", "--disable-error-code=top-level-await", "--no-error-summary"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(folder / "mypy.ini"),
            "--cache-dir",
            str(mypy_cache()),
            *quiet,
            ".",
        ],
        cwd=code,
        env={**os.environ, "MYPYPATH": str(folder / "site")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_python_block_of_the_docs_type_checks_as_a_users_mypy_would(tmp_path: Path) -> None:
    modules = python_blocks()
    assert len(modules) >= 15, sorted(modules)  # the README's, the tutorial's files, use.md's, testing.md's ...
    checked = run_mypy(tmp_path, modules)
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert checked.returncode == 0 and not errors, "\n".join(errors) or checked.stdout + checked.stderr


def test_the_hints_take_what_the_docs_write() -> None:
    """The same calls as the docs, without mypy: the collections they pass are kept as frozensets and tuples."""
    from gatedloop.graph import CallContext, Limits, PendingRequest, ToolPolicy, UsageLimit

    ctx = CallContext(user_id="bo", roles={"finance"})
    assert ctx.roles == frozenset({"finance"}) and ctx.extra == {}
    policy = ToolPolicy(approvers=["finance"], allowed_decisions=["approve", "reject"], limits=[UsageLimit(at_most=3)])
    assert policy.approvers == frozenset({"finance"})
    assert policy.allowed_decisions == ("approve", "reject") and isinstance(policy.limits, tuple)
    assert hash(policy) == hash(
        ToolPolicy(approvers={"finance"}, allowed_decisions=("approve", "reject"), limits=(UsageLimit(at_most=3),))
    )
    assert Limits(max_model_calls=8).max_tool_calls == 40
    try:
        PendingRequest.parse(None)
    except ValueError as exc:
        assert "not waiting for an answer" in str(exc)
    else:
        raise AssertionError("PendingRequest.parse(None) returned")
