"""Packaging promises: the namespace layout, the README's diagram and commands, the Studio entry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("##", 1)[0]
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
