"""A manual, re-runnable check: LangChain's Agent Chat UI (github.com/langchain-ai/agent-chat-ui) in Debian's chromium
against gatedloop served by Aegra (deploy/aegra/aegra.json) with reviewer tokens.

What it needs:

- `GATEDLOOP_AEGRA`: the `aegra` of a Python 3.12 venv with aegra-cli and this checkout (`.ci/aegra_venv.sh` prints
  it; it installs a copy of the checkout, not an editable one: run it again after changing gatedloop);
- `GATEDLOOP_TEST_PG_URL` (a Postgres where it may create a database: `.ci/start_postgres.sh`) and
  `GATEDLOOP_TEST_REDIS_URL` (`.ci/start_redis.sh`);
- this checkout's `.venv` (`pip install -e '.[test]'`: Playwright's Python package, langgraph-sdk, psycopg) and
  chromium at /usr/bin/chromium (`GATEDLOOP_CHROMIUM` overrides);
- Agent Chat UI built for production, node 20 and npm:

      git clone https://github.com/langchain-ai/agent-chat-ui /work/acui && cd /work/acui
      git checkout fdc87e65307581b02898d33c62b3f285e56bd85b    # the commit checked on 2026-12-02
      # offline build only (no route to fonts.googleapis.com): drop next/font/google's Inter from the layout
      sed -i -e '/next\\/font\\/google/d' \\
             -e '/^const inter = Inter({/,/^});/c const inter = { className: "font-sans" };' src/app/layout.tsx
      npx -y pnpm@10.5.1 install --frozen-lockfile
      NEXT_TELEMETRY_DISABLED=1 npx next build

  (built with no NEXT_PUBLIC_API_URL / NEXT_PUBLIC_ASSISTANT_ID, so it opens on its setup form: deployment URL,
  assistant / graph id and "LangSmith API Key", which it keeps in localStorage and sends as `X-Api-Key`).

Run, from the repository's root:

    .venv/bin/python deploy/aegra/agent_chat_ui_check.py --ui-dir /work/acui docs/screenshots/agent-chat-ui

It creates a fresh database, writes a copy of deploy/aegra/aegra.json into a temporary folder (absolute paths, and
`http.cors.allow_origins` set to the UI's origin alone; deploy/aegra/aegra.json sets no `http.cors`, and Aegra's
default then, every origin without credentials, works for the UI too: `--default-cors` runs the checks so), starts
one `aegra serve` of it (reviewers: deploy/aegra/reviewers.example.json) and `next start` of the built UI
(`--ui-url` uses a UI already running instead; it must have been built the same way), then checks, in chromium:

1. `seat`: ana's token as the API key, graph `gatedloop`, "Reserve a seat in workshop WS-101 for Ana": the UI shows
   the gated `reserve_seat` request; she approves it in the UI; over langgraph-sdk the thread is `completed` with one
   tool message, `success`; the UI shows the answer.
2. `refusal`: ana's token, graph `tables`, "a table for 4 at Chez Ana": `reserve_table` needs role `hosts` and ana is
   `staff`; she approves it in the UI; the gate refuses and the request waits again with an `error` (read over
   langgraph-sdk). The run's stream ends with an `error` event (gatedloop.inbox.refusals), which the UI shows as an
   error toast; the check fails unless that toast names the refusal, the request is still shown to be answered,
   and the request's Description panel (the action's `description`) shows it too, as a paragraph of its own.
3. `bad-token`: a token the reviewers file does not hold: the server answers 401/403 and the UI shows an error.

Screenshots go to the folder given as the argument; a summary (JSON) is printed. Exits 1 on a failed check.
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # Aegra started as tests/test_aegra.py starts it (`shipped`)

from aegra_servers import AegraServer, free_port, fresh_database, live_members, server_env  # noqa: E402

ANA = "ana-example-token-change-me"
UNKNOWN = "nobody-has-this-token-0000"
SEAT = "Reserve a seat in workshop WS-101 for Ana"
TABLE = "a table for 4 at Chez Ana"
REFUSED = "Previous answer refused"


class CheckFailed(AssertionError):
    pass


def expect(condition: Any, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def config_copy(folder: Path, ui_origin: str | None) -> Path:
    """deploy/aegra/aegra.json with absolute paths (it lives elsewhere) and CORS for the UI's origin (None: none
    set, Aegra's default)."""
    config = json.loads((HERE / "aegra.json").read_text())
    config["dependencies"] = [str((HERE / d).resolve()) for d in config.get("dependencies", [])]
    config["graphs"] = {
        name: str((HERE / path.split(":")[0]).resolve()) + ":" + path.split(":")[1]
        for name, path in config["graphs"].items()
    }
    if ui_origin is not None:
        config.setdefault("http", {})["cors"] = {"allow_origins": [ui_origin]}
    target = folder / "aegra.json"
    target.write_text(json.dumps(config, indent=2))
    return target


@contextlib.contextmanager
def next_start(ui_dir: Path, port: int, log: Path) -> Iterator[str]:
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["npx", "next", "start", "-H", "127.0.0.1", "-p", str(port)],
            cwd=ui_dir,
            env={**os.environ, "NEXT_TELEMETRY_DISABLED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            expect(process.poll() is None, f"next start exited {process.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise CheckFailed(f"next start did not answer in 120 s: {log.read_text()[-2000:]}")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        deadline = time.monotonic() + 10
        while live_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def sdk(api_url: str, token: str) -> Any:
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=api_url, headers={"X-Api-Key": token}, timeout=60)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise CheckFailed(f"timed out after {timeout_s} s waiting for {what}")


class Browser:
    """One chromium; each check gets a fresh context (its own localStorage: the UI keeps the API key there)."""

    def __init__(self, playwright: Any, chromium: str, ui_url: str, shots: Path) -> None:
        self.browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        self.ui_url, self.shots = ui_url, shots

    def connect(self, api_url: str, graph: str, token: str) -> tuple[Any, list[dict[str, Any]]]:
        """The UI's setup form, filled as a person would; returns the page and a log of its calls to the server."""
        page = self.browser.new_context(viewport={"width": 1500, "height": 1250}).new_page()
        page.set_default_timeout(60_000)
        calls: list[dict[str, Any]] = []

        def seen(response: Any) -> None:
            if response.url.startswith(api_url):
                key = response.request.headers.get("x-api-key")
                calls.append(
                    {"url": response.url, "method": response.request.method, "status": response.status, "key": key}
                )

        page.on("response", seen)
        page.goto(self.ui_url)
        page.fill("#apiUrl", api_url)
        page.fill("#assistantId", graph)
        page.fill("#apiKey", token)
        page.get_by_role("button", name="Continue").click()
        page.get_by_placeholder("Type your message...").wait_for()
        return page, calls

    def send(self, page: Any, text: str) -> None:
        page.get_by_placeholder("Type your message...").fill(text)
        page.get_by_role("button", name="Send").click()

    def shot(self, page: Any, name: str) -> str:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path))
        return str(path)


def thread_of(page: Any) -> str:
    found = re.search(r"[?&]threadId=([0-9a-f-]{36})", page.url)
    expect(found, f"the UI's URL names no thread: {page.url}")
    return found.group(1)  # type: ignore[union-attr]


def visible_text(page: Any) -> str:
    return page.locator("body").inner_text()


def check_seat(ui: Browser, api_url: str, summary: dict[str, Any]) -> None:
    page, calls = ui.connect(api_url, "gatedloop", ANA)
    ui.send(page, SEAT)
    approve = page.get_by_role("button", name="Approve", exact=True)
    approve.wait_for()
    page.get_by_text("reserve_seat").first.wait_for()
    summary["shots"].append(ui.shot(page, "1-seat-interrupt"))
    thread_id = thread_of(page)
    summary["thread"] = thread_id
    summary["x_api_key_sent"] = bool(calls) and all(c["key"] == ANA for c in calls)
    expect(summary["x_api_key_sent"], f"the UI's calls did not all carry the API key as X-Api-Key: {calls[:5]}")
    preflight = httpx.options(
        f"{api_url}/threads",
        headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    summary["preflight_from_another_origin"] = preflight.status_code
    approve.click()
    state = wait_for(
        lambda: (s := sdk(api_url, ANA).threads.get_state(thread_id))["values"].get("status") == "completed" and s,
        90,
        "the seat's thread to complete",
    )
    tools = [m for m in state["values"]["messages"] if m["type"] == "tool"]
    proposed = [c["args"] for m in state["values"]["messages"] if m["type"] == "ai" for c in m.get("tool_calls") or []]
    summary["proposed"] = proposed
    expect(proposed == [{"event_id": "WS-101", "participant": "Ana"}], f"the model proposed {proposed}")
    summary["tool_messages"] = [(m["name"], m["status"]) for m in tools]
    summary["answer"] = state["values"].get("answer")
    expect([m["status"] for m in tools] == ["success"], f"expected one successful tool message: {tools}")
    expect(not state.get("interrupts"), f"the thread still waits: {state.get('interrupts')}")
    page.get_by_text("Reserved").first.wait_for()
    summary["ui_shows_answer"] = True
    summary["shots"].append(ui.shot(page, "2-seat-approved"))
    page.context.close()


def check_refusal(ui: Browser, api_url: str, summary: dict[str, Any]) -> None:
    page, _ = ui.connect(api_url, "tables", ANA)
    ui.send(page, TABLE)
    approve = page.get_by_role("button", name="Approve", exact=True)
    approve.wait_for()
    page.get_by_text("reserve_table").first.wait_for()
    thread_id = thread_of(page)
    summary["thread"] = thread_id
    summary["shots"].append(ui.shot(page, "3-table-interrupt"))
    approve.click()
    error_toast = page.locator("[data-sonner-toast]", has_text="An error occurred").first
    error_toast.wait_for()  # read at once: a toast closes itself after a few seconds
    error_toasts = [error_toast.inner_text()]
    summary["shots"].append(ui.shot(page, "4-table-refused-toast"))

    def refused() -> Any:
        waiting = sdk(api_url, ANA).threads.get_state(thread_id).get("interrupts") or []
        return waiting and waiting[0]["value"].get("error") and waiting[0]["value"]

    request = wait_for(refused, 90, "the refused request to wait again with an error")
    error = request["error"]
    summary["error"] = error
    summary["description_has_refusal"] = all(error in a["description"] for a in request["action_requests"])
    expect("hosts" in error, f"the refusal does not name the role: {error}")
    # The UI reloads the thread after its run ends: wait for the re-asked request (its Approve button again).
    approve.wait_for()
    page.wait_for_timeout(1500)
    main = visible_text(page)
    summary["main_view_shows_refusal"] = error in main or REFUSED in main
    summary["toasts"] = [t.inner_text() for t in page.locator("[data-sonner-toast]").all()]
    summary["error_toast"] = error_toasts
    summary["toast_shows_refusal"] = any(error in t for t in error_toasts)
    summary["main_view_text"] = main[-1200:]
    summary["shots"].append(ui.shot(page, "5-table-refused-main-view"))
    expect(summary["toast_shows_refusal"], f"no toast names the refusal: {summary['toasts']}")
    page.get_by_role("button", name="Description", exact=True).click()
    page.wait_for_timeout(500)
    panel = visible_text(page)
    summary["description_panel_shows_refusal"] = REFUSED in panel and "hosts" in panel.split(REFUSED, 1)[-1]
    paragraphs = [p.inner_text() for p in page.locator("p", has_text=REFUSED).all()]
    summary["refusal_paragraph"] = paragraphs
    summary["refusal_is_its_own_paragraph"] = any(p.startswith(REFUSED) for p in paragraphs)
    summary["shots"].append(ui.shot(page, "6-table-refused-description"))
    expect(summary["description_panel_shows_refusal"], "the Description panel does not show the refusal")
    expect(summary["refusal_is_its_own_paragraph"], f"the refusal is not a paragraph of its own: {paragraphs}")
    page.context.close()


def check_bad_token(ui: Browser, api_url: str, summary: dict[str, Any]) -> None:
    direct = httpx.post(f"{api_url}/threads", headers={"X-Api-Key": UNKNOWN}, json={}, timeout=10)
    summary["direct_post_threads_status"] = direct.status_code
    expect(direct.status_code in (401, 403), f"an unknown token got {direct.status_code} for POST /threads")
    page, calls = ui.connect(api_url, "gatedloop", UNKNOWN)
    ui.send(page, SEAT)
    toast = page.locator("[data-sonner-toast]").first
    toast.wait_for()
    page.wait_for_timeout(1500)
    summary["toasts"] = [t.inner_text() for t in page.locator("[data-sonner-toast]").all()]
    summary["statuses"] = sorted({(c["method"], re.sub(r"^https?://[^/]+", "", c["url"]), c["status"]) for c in calls})
    summary["shots"].append(ui.shot(page, "7-unknown-token"))
    expect(any(c["status"] in (401, 403) for c in calls), f"the UI's calls got no 401/403: {summary['statuses']}")
    expect(any("error" in t.lower() or "failed" in t.lower() for t in summary["toasts"]), "the UI showed no error")
    page.context.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shots", type=Path, help="folder for the screenshots")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--ui-dir", type=Path, help="a built Agent Chat UI checkout: `next start` is run there")
    where.add_argument("--ui-url", help="an Agent Chat UI already running (its origin is given CORS)")
    parser.add_argument("--ui-port", type=int, default=0, help="port for `next start` (default: a free one)")
    parser.add_argument(
        "--default-cors", action="store_true", help="set no http.cors in the copy (Aegra's default: every origin)"
    )
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    executable = os.environ["GATEDLOOP_AEGRA"]
    pg_url, redis_url = os.environ["GATEDLOOP_TEST_PG_URL"], os.environ["GATEDLOOP_TEST_REDIS_URL"]
    chromium = os.environ.get("GATEDLOOP_CHROMIUM", "/usr/bin/chromium")
    args.shots.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="acui-check-")))
        ui_port = args.ui_port or free_port()
        ui_origin = args.ui_url.rstrip("/") if args.ui_url else f"http://127.0.0.1:{ui_port}"
        database_url = stack.enter_context(fresh_database(pg_url))
        env = server_env(
            database_url, redis_url, uuid.uuid4().hex[:10], GATEDLOOP_AUTH_FILE=str(HERE / "reviewers.example.json")
        )
        del env["GATEDLOOP_AUTH_TOKENS"], env["PYTHONPATH"]
        config = config_copy(workdir, None if args.default_cors else ui_origin)
        server = AegraServer("acui", executable, config, env, workdir)
        stack.callback(server.stop)
        server.start()
        ui_url = args.ui_url or stack.enter_context(next_start(args.ui_dir, ui_port, workdir / "next.log"))
        playwright = stack.enter_context(sync_playwright())
        ui = Browser(playwright, chromium, ui_url, args.shots)
        stack.callback(ui.browser.close)
        for name, check in (("seat", check_seat), ("refusal", check_refusal), ("bad-token", check_bad_token)):
            results[name] = {"shots": []}
            try:
                check(ui, server.url, results[name])
                results[name]["ok"] = True
            except Exception as exc:  # one check's failure is reported, the others still run
                results[name].update(ok=False, failure=f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    for context in ui.browser.contexts:
                        results[name]["shots"].append(ui.shot(context.pages[0], f"failed-{name}"))
                        context.close()
    print(json.dumps(results, indent=2, default=str))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
