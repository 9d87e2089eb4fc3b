"""Packaging promises: the namespace layout, the README's diagram and commands, the Studio entry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from doc_text import section

ROOT = Path(__file__).parent.parent


def test_no_bare_top_level_modules_are_importable(tmp_path):
    probe = (
        "import importlib.util, json\n"
        "names = ['tools', 'nodes', 'graph', 'checkpoints', 'cli']\n"
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))\n"
        "import gatedloop.graph, gatedloop.nodes, gatedloop.tools, gatedloop.checkpoints, gatedloop.cli\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == dict.fromkeys(["tools", "nodes", "graph", "checkpoints", "cli"], False)


def test_readme_diagram_matches_the_compiled_graph():
    from gatedloop.demo.studio import make_studio_graph

    graph = make_studio_graph()
    drawn = graph.get_graph().draw_mermaid()
    body = [line.strip() for line in drawn.splitlines() if "-->" in line or "-.->" in line]
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", readme, re.DOTALL)
    assert block, "README has no mermaid block"
    assert sorted(line.strip() for line in block.group(1).splitlines() if "->" in line) == sorted(body)
    assert {"model", "validate", "approve", "execute", "finalize"} <= set(graph.get_graph().nodes)


def test_ci_runs_the_readme_test_command_verbatim():
    quick = section("Quick start", page="README.md")
    commands = re.findall(r"```bash\n(.*?)\n```", quick)
    assert len(commands) == 2, "the quick start is exactly two commands"
    assert "gatedloop demo" in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_langgraph_json_names_a_graph_factory_without_a_checkpointer():
    import asyncio
    from types import SimpleNamespace

    config = json.loads((ROOT / "langgraph.json").read_text())
    module, _, attr = config["graphs"]["gatedloop"].partition(":")
    factory = getattr(__import__(module, fromlist=[attr]), attr)
    graph = asyncio.run(factory({"configurable": {}}, SimpleNamespace(context=None)))  # as langgraph-api calls it
    assert graph.checkpointer is None


def test_the_documented_architecture_names_files_and_tests_that_exist():
    """The architecture section is a map: every module and test it names must be there to find."""
    architecture = section("Architecture")
    files = set(re.findall(r"\b((?:tools|checkpoints|nodes|graph|demo|inbox|cli|tests)/\w+\.py)\b", architecture))
    tests = set(re.findall(r"`(tests/\w+\.py)::(\w+)`", architecture))
    assert len(files) > 20 and len(tests) > 10, "the section lost its map"
    assert not [f for f in sorted(files) if not (ROOT / f).is_file()], "files named that do not exist"
    missing = [f"{path}::{name}" for path, name in sorted(tests) if f"def {name}(" not in (ROOT / path).read_text()]
    assert not missing, f"tests named that do not exist: {missing}"
    rows = re.findall(r"^\| (\d+)\. (.*)$", architecture, re.MULTILINE)
    invariants = [int(n) for n, _ in rows]
    assert invariants == list(range(1, len(invariants) + 1)) and len(invariants) >= 13, invariants
    unchecked = [n for n, row in rows if not re.search(r"`tests/\w+\.py::\w+`", row)]
    assert not unchecked, f"invariants no named test checks: {unchecked}"


def test_the_manifest_installs_what_its_http_app_needs():
    """`langgraph build` installs langgraph.json's dependencies only (a local "." without extras): the inbox's
    packages must be listed there (.ci/check_manifest.sh then serves the manifest from exactly those)."""
    import tomllib

    def name(spec: str) -> str:
        return re.split(r"[<>=\[ ;]", spec, maxsplit=1)[0].lower()

    manifest = json.loads((ROOT / "langgraph.json").read_text())
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = {name(dep) for dep in manifest["dependencies"] if not dep.startswith(".")}
    assert "." in manifest["dependencies"]
    assert {name(dep) for dep in extras["inbox"]} <= listed


def test_the_readme_notebook_install_line_brings_jupyter_lab_and_every_package_the_notebooks_import():
    """The Notebooks section's `pip install '.[EXTRAS]'` then `jupyter lab`: the extras (with the core dependencies)
    name JupyterLab and the distribution of every module a notebook imports or runs with `python -m`."""
    import importlib.metadata
    import tomllib

    def name(spec: str) -> str:
        return re.split(r"[<>=\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def requirements(extra: str) -> set[str]:
        specs = project["optional-dependencies"][extra]
        inner = [re.search(r"gatedloop\[(.+?)\]", s) for s in specs]
        return {name(s) for s in specs if not s.startswith("gatedloop")}.union(
            *(requirements(e.strip()) for m in inner if m for e in m.group(1).split(","))
        )

    notebooks_doc = section("Notebooks")
    [extras] = re.findall(r"pip install '\.\[([\w,]+)\]'", notebooks_doc)
    assert "jupyter lab notebooks/" in notebooks_doc
    allowed = {name(s) for s in project["dependencies"]}.union(*(requirements(e) for e in extras.split(",")))
    assert "jupyterlab" in allowed

    providers = importlib.metadata.packages_distributions()
    modules = set()
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            modules |= set(re.findall(r"^\s*(?:from|import)\s+(\w+)", source, re.M))
            modules |= set(re.findall(r"""["']-m["'],\s*["'](\w+)["']""", source))
    third_party = {m for m in modules if m not in sys.stdlib_module_names and m != "gatedloop"}
    assert {"langgraph_sdk", "langchain", "langgraph_cli"} <= third_party  # the scan sees what the notebooks use
    missing = {m: providers.get(m) for m in third_party if not {name(d) for d in providers.get(m, [])} & allowed}
    assert not missing, f"notebooks import these, not installed by '.[{extras}]': {missing}"
