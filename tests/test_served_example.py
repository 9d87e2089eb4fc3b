"""Your agent, served (issue 22, items 4-5): `examples/bookings`, a package of its own with two graphs in one
`langgraph.json` (gatedloop's checkpointer, auth and inbox), served by the real `langgraph dev` and driven by
`langgraph-sdk`. A request made through the API appears in `/inbox`; the inbox's answer is a run through the
server (the thread is no longer `interrupted`, the booking is made once); a second answer to it is refused; the
same for the second graph; and the inbox never shows a reviewer a request her role cannot decide."""

from __future__ import annotations

import http.cookiejar
import json
import re
import sqlite3
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from devserver import run_dev_server
from langgraph_sdk import get_sync_client

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bookings"
USERS = {
    "ana": ("ana-token-0123456789abcdef", ["staff"]),
    "hal": ("hal-token-0123456789abcdef", ["hosts"]),
    "tia": ("tia-token-0123456789abcdef", ["travel"]),
}


@dataclass
class Served:
    url: str
    db: Path

    def api(self, user: str) -> Any:
        return get_sync_client(url=self.url, api_key=None, headers={"Authorization": f"Bearer {USERS[user][0]}"})

    def bookings(self) -> list[tuple[str, str, int]]:
        path = self.db.with_name("bookings.sqlite")
        if not path.exists():
            return []
        with sqlite3.connect(path) as conn:
            return conn.execute("SELECT kind, what, people FROM bookings ORDER BY rowid").fetchall()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("bookings")
    config = {
        "supervisor_roles": ["hosts", "travel"],
        "tokens": {t: {"user_id": u, "roles": r} for u, (t, r) in USERS.items()},
    }
    env = {
        "GATEDLOOP_DB": str(folder / "served.sqlite"),
        "GATEDLOOP_AUTH_TOKENS": json.dumps(config),
        "GATEDLOOP_AUTH_FILE": None,
        "GATEDLOOP_LEDGER": None,
        "PYTHONPATH": str(EXAMPLE),
    }
    with run_dev_server(EXAMPLE, env=env, workdir=folder / "server") as url:
        yield Served(url, folder / "served.sqlite")


class Inbox:
    """A reviewer's browser session on /inbox (cookies kept), signed in with her API token."""

    def __init__(self, served: Served, user: str):
        self.url = served.url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        page = self.open("/inbox")
        self.csrf = self._csrf(page)
        page = self.open("/inbox/login", csrf=self.csrf, token=USERS[user][0])
        self.csrf = self._csrf(page)

    def open(self, path: str, **form: str) -> str:
        data = urllib.parse.urlencode(form).encode() if form else None
        with self.opener.open(f"{self.url}{path}", data=data, timeout=120) as response:
            return response.read().decode()

    def card(self, thread_id: str) -> str | None:
        page = self.open("/inbox")
        start = page.find(f'data-key="{thread_id}"')
        return page[start : page.find("</section>", start)] if start >= 0 else None

    def approve(self, thread_id: str, request_id: str) -> str:
        answer = {"thread_id": thread_id, "request_id": request_id, "decision-0": "approve"}
        return self.open("/inbox/answer", csrf=self.csrf, **answer)

    @staticmethod
    def _csrf(page: str) -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert found is not None, page[:2000]
        return found.group(1)


@pytest.mark.parametrize(
    ("graph", "text", "reviewer", "other", "booked"),
    [
        ("tables", "a table for 4 at Chez Ana", "hal", "tia", ("table", "Chez Ana", 4)),
        ("rooms", "a room for 2 nights at Hotel Sol", "tia", "hal", ("room", "Hotel Sol", 2)),
    ],
)
def test_a_request_of_each_served_graph_is_answered_in_the_inbox_through_the_server(
    served: Served, graph: str, text: str, reviewer: str, other: str, booked: tuple[str, str, int]
) -> None:
    ana = served.api("ana")
    thread_id = ana.threads.create()["thread_id"]
    out = ana.runs.wait(thread_id, graph, input={"messages": [{"role": "user", "content": text}]})
    [interrupt] = out["__interrupt__"]
    request_id = interrupt["value"]["request_id"]
    assert ana.threads.get(thread_id)["status"] == "interrupted"

    assert Inbox(served, other).card(thread_id) is None  # her role cannot decide this tool: not shown to her
    inbox = Inbox(served, reviewer)
    card = inbox.card(thread_id)
    assert card is not None and booked[1] in card and "requested by ana" in card
    before = len(served.bookings())
    page = inbox.approve(thread_id, request_id)
    assert f"Thread {thread_id}: decided; the thread ended: completed" in page

    thread = ana.threads.get(thread_id)
    assert thread["status"] == "idle" and thread["values"]["status"] == "completed"  # the server's own status
    assert thread_id not in [t["thread_id"] for t in ana.threads.search(status="interrupted")]
    assert served.bookings()[before:] == [booked]
    assert f"Done: {booked[0].upper()}-" in thread["values"]["answer"]

    again = inbox.approve(thread_id, request_id)
    assert f"Thread {thread_id}: this request was already answered or cancelled." in again
    assert inbox.card(thread_id) is None
    assert len(served.bookings()) == before + 1  # never twice


def test_the_inbox_answers_as_the_signed_in_reviewer_so_the_servers_auth_and_the_policy_decide(
    served: Served,
) -> None:
    """The run carries the reviewer's own token: the graph records her (the server's user), never a context."""
    ana = served.api("ana")
    thread_id = ana.threads.create()["thread_id"]
    out = ana.runs.wait(thread_id, "tables", input={"messages": [{"role": "user", "content": "a table for 2 at Mar"}]})
    request_id = out["__interrupt__"][0]["value"]["request_id"]
    Inbox(served, "hal").approve(thread_id, request_id)
    with sqlite3.connect(served.db) as conn:
        actors = conn.execute(
            "SELECT actor FROM gatedloop_audit WHERE thread_id=? AND event='decision'", (thread_id,)
        ).fetchall()
    assert actors == [("hal",)]


def test_each_served_graph_has_real_input_and_output_schemas_for_studio(served: Served) -> None:
    """Studio renders a graph's input form from the server's schema endpoint (it was `null`)."""
    api = served.api("hal")
    for assistant in api.assistants.search():
        schemas = api.assistants.get_schemas(assistant["assistant_id"])
        assert "messages" in schemas["input_schema"]["properties"], assistant["graph_id"]
        assert {"messages", "status", "answer"} <= set(schemas["output_schema"]["properties"]), assistant["graph_id"]


TABLE_REQUEST = "a table for 4 at Chez Ana"


@pytest.mark.parametrize("content", [TABLE_REQUEST, [{"type": "text", "text": TABLE_REQUEST}]])
def test_the_offline_model_reads_the_request_as_text_or_as_content_blocks(
    content: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent Chat UI sends a message's content as blocks (`[{"type": "text", "text": ...}]`): the scripted model
    reads the text, not the blocks' repr (which made the restaurant "Chez Ana', 'type': 'text'}]")."""
    from langchain_core.messages import HumanMessage

    monkeypatch.syspath_prepend(str(EXAMPLE))
    from bookings_agent.graphs import scripted_booking

    [proposed] = scripted_booking([HumanMessage(content=content)]).tool_calls
    assert (proposed["name"], proposed["args"]) == ("reserve_table", {"restaurant": "Chez Ana", "people": 4})
