"""Rollback, thread copy and pruning under the real `langgraph dev`, driven through langgraph-sdk.

The server runs `tests/support/server_ops_app.py` on gatedloop's SQLite checkpointer (`studio_checkpointer`, so a
`GatedAsyncSqliteSaver`): it must start without a warning about missing saver methods, delete a rolled-back
run's checkpoints (`adelete_for_runs`) while the ledger keeps the write that run did, copy a thread with its
ledger rows (`acopy_thread`), and delete a thread through `threads.prune`. The in-memory runtime behind
`langgraph dev` answers `keep_latest` itself with 422 (it never reaches the saver), so that strategy is run
through the saver on the same file, and the server then goes on with the pruned thread.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from devserver import gated_project, run_dev_server
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import UnprocessableEntityError
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.ledger import SqliteLedger, idempotency_key

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).parent / "support"
APP = "server_ops"
WAIT_S = 30.0


@dataclass
class Server:
    client: Any
    db: Path
    folder: Path
    log: Path

    def run(self, thread_id: str, text: str, **kwargs: Any) -> Any:
        return self.client.runs.create(
            thread_id, APP, input={"messages": [{"role": "user", "content": text}]}, **kwargs
        )

    def wait(self, thread_id: str, text: str) -> dict[str, Any]:
        out = self.client.runs.wait(thread_id, APP, input={"messages": [{"role": "user", "content": text}]})
        assert isinstance(out, dict) and out["status"] == "completed", out
        return out

    def checkpoint_runs(self, thread_id: str) -> list[str | None]:
        with closing(sqlite3.connect(self.db, timeout=30)) as conn:
            rows = conn.execute("SELECT metadata FROM checkpoints WHERE thread_id=?", (thread_id,)).fetchall()
        return [json.loads(m).get("run_id") for (m,) in rows]

    def ledger(self, thread_id: str) -> list[tuple[str, str, str]]:
        ledger = SqliteLedger(self.db)
        try:
            return [(e.call_id, e.state, e.idempotency_key) for e in ledger.entries(thread_id)]
        finally:
            ledger.close()

    def effect_keys(self) -> list[str | None]:
        return [key for _, _, key in Effects(self.folder / "effects.sqlite").rows("book")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("server-ops")
    project = gated_project(folder, {APP: str(SUPPORT / "server_ops_app.py:graph")})
    db = folder / "runs.sqlite"
    env = {"GATEDLOOP_DB": str(db), "SERVER_OPS_DIR": str(folder), "PYTHONPATH": str(SUPPORT)}
    with run_dev_server(project, env=env, workdir=folder / "server") as url:
        try:
            yield Server(
                get_sync_client(url=url, api_key=None, timeout=60), db, folder, folder / "server" / "langgraph-dev.log"
            )
        finally:
            (folder / "open-held").touch()


def messages_text(values: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in values["messages"]]


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"gave up waiting for {path.name}"
        time.sleep(0.05)


def test_the_server_uses_every_saver_method_and_warns_about_none(server: Server) -> None:
    log = server.log.read_text()
    assert "Using custom checkpointer: GatedAsyncSqliteSaver" in log
    assert "Custom checkpointer missing" not in log


def test_rollback_deletes_the_cancelled_runs_checkpoints_and_its_write_is_reported_not_rerun(server: Server) -> None:
    client = server.client
    thread_id = client.threads.create()["thread_id"]
    held = server.run(thread_id, "book 1 seat and wait held")
    wait_for(server.folder / "waiting-held")  # the seat is booked; the run is held in its second step
    assert server.effect_keys() == [idempotency_key(thread_id, "b1")]
    assert held["run_id"] in server.checkpoint_runs(thread_id)

    (server.folder / "open-again").touch()
    again = server.run(thread_id, "book 1 seat and wait again", multitask_strategy="rollback")
    out = client.runs.join(thread_id, again["run_id"])

    assert held["run_id"] not in server.checkpoint_runs(thread_id), "the rolled-back run's checkpoints are gone"
    assert set(server.checkpoint_runs(thread_id)) == {again["run_id"]}
    assert messages_text(out)[0] == "book 1 seat and wait again"
    assert "book 1 seat and wait held" not in messages_text(out)
    # The new run proposes the same call id; the ledger still holds the rolled-back run's write.
    assert server.ledger(thread_id)[0][:2] == ("b1", "done")
    assert server.effect_keys() == [idempotency_key(thread_id, "b1")], "booked once, not again"
    assert out["status"] == "completed"


def test_copy_carries_the_ledger_and_the_copy_books_under_its_own_key(server: Server) -> None:
    client = server.client
    (server.folder / "open-now").touch()
    source = client.threads.create()["thread_id"]
    server.wait(source, "book 2 lunch and wait now")

    copied = client.threads.copy(source)
    copy = copied["thread_id"]
    assert copy != source
    assert (
        client.threads.get_state(copy)["values"]["messages"] == client.threads.get_state(source)["values"]["messages"]
    )
    assert server.ledger(copy) == server.ledger(source)  # same rows, keys as the writes were started
    out = server.wait(copy, "book 3 cake and wait now")
    assert out["status"] == "completed"
    assert idempotency_key(copy, "b2") in server.effect_keys()
    assert idempotency_key(source, "b2") not in server.effect_keys()
    assert server.effect_keys().count(idempotency_key(source, "b1")) == 1


def test_prune_through_the_sdk_and_keep_latest_on_the_same_file(server: Server) -> None:
    client = server.client
    (server.folder / "open-now").touch()
    kept, gone = client.threads.create()["thread_id"], client.threads.create()["thread_id"]
    for turn in range(3):
        server.wait(kept, f"book {turn + 1} tea and wait now")
    # Studio's "rerun from here": a branch from the end of the first turn; the later turns are left behind.
    history = client.threads.get_history(kept, limit=100)
    [first_turn] = [s for s in history if len(s["values"]["messages"]) == 6 and not s["next"]]
    forked = client.runs.wait(
        kept,
        APP,
        input={"messages": [{"role": "user", "content": "book 9 tea and wait now"}]},
        checkpoint_id=first_turn["checkpoint"]["checkpoint_id"],
    )
    server.wait(gone, "book 1 milk and wait now")
    before = len(server.checkpoint_runs(kept))

    with pytest.raises(UnprocessableEntityError, match="not supported in in-memory runtime"):
        client.threads.prune([kept], strategy="keep_latest")
    assert client.threads.prune([gone], strategy="delete")["pruned_count"] == 1
    assert server.checkpoint_runs(gone) == []
    assert [s for _, s, _ in server.ledger(gone)] == ["done"], "the ledger outlives the thread"

    conversation = messages_text(client.threads.get_state(kept)["values"])
    assert conversation == messages_text(forked)
    with open_sqlite(server.db) as saver:
        saver.prune([kept], strategy="keep_latest")
    assert 1 <= len(server.checkpoint_runs(kept)) < before
    assert messages_text(client.threads.get_state(kept)["values"]) == conversation
    out = server.wait(kept, "book 4 tea and wait now")
    assert messages_text(out)[: len(conversation)] == conversation
    assert messages_text(out)[len(conversation)] == "book 4 tea and wait now"
