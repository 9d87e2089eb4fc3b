"""A resume as a client of the served API sees it: a refused answer comes back as an error (gatedloop.inbox.refusals).

`resumed` waits for the run without letting the SDK raise, and checks the reply on every resume a test sends: an
answer the gate refused (the run ends on a request asking again, with its `error`) carries `__error__`
AnswerRefused with that same reason, the error `runs.wait` raises by default; an accepted one carries none.
"""

from __future__ import annotations

from typing import Any


def refusal_asked(out: dict[str, Any]) -> str | None:
    """The reason in the request the run ended on, if it asks again after a refusal."""
    values = [i.get("value") for i in out.get("__interrupt__") or []]
    return next((v["error"] for v in values if isinstance(v, dict) and v.get("error")), None)


def resumed(client: Any, thread_id: str, graph: str, resume: Any, **kwargs: Any) -> dict[str, Any]:
    out = client.runs.wait(thread_id, graph, command={"resume": resume}, raise_error=False, **kwargs)
    refusal = refusal_asked(out)
    if refusal is None:
        assert (out.get("__error__") or {}).get("error") != "AnswerRefused", out
    else:
        assert out.get("__error__") == {"error": "AnswerRefused", "message": refusal}, out.get("__error__")
    return out
