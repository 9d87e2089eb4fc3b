"""Approval conditions (issue 55, part 2): egress, recipients, counterparties, own resources; each a pure predicate
that asks when it cannot read the call, refuses a bad configuration by name, and composes with `approval=`
predicates, `mcp_policies` and validators."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import (
    CallContext,
    ToolPolicy,
    any_of,
    ask_when,
    counterparty_unknown,
    not_own,
    recipients_outside,
    refuse_when,
    url_outside,
)
from gatedloop.tools.mcp import mcp_policies

ANA = CallContext(user_id="ana")
NOBODY = CallContext()

EGRESS = url_outside(["example.com", "*.docs.org", "10.0.0.1", "bücher.de", "https://api.bank.com/v1"])


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/x",
        "http://EXAMPLE.com.:8080/a",
        "example.com/page?next=https://evil.com",  # no scheme: the host is what counts
        "https://a.docs.org/",
        "http://10.0.0.1/",
        "https://bücher.de/x",
        "https://xn--bcher-kva.de",
        "https://api.bank.com/v1",
        "https://api.bank.com:443/v1/accounts",
    ],
)
def test_url_outside_lets_a_read_inside_the_allowlist_run(url):
    assert EGRESS({"url": url}, ANA) is False


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.com",
        "www.example.com",  # a host entry is that host only
        "https://docs.org/",  # a wildcard is the subdomains, not the domain
        "https://example.com.evil.com",
        "https://example.com@evil.com",
        "https://evil.com\\@example.com",
        "https://exa mple.com",
        "ftp://example.com",
        "javascript:alert(1)",
        "https://api.bank.com/v10",  # a prefix ends at a path segment
        "https://api.bank.com/v1/../admin",
        "https://api.bank.com/v1/%2e%2e/admin",
        "http://api.bank.com/v1/x",  # another scheme than the prefix's
        "https://api.bank.com:8443/v1",  # another port
        "",
    ],
)
def test_url_outside_asks_for_a_read_outside_it_or_one_it_cannot_read(url):
    assert EGRESS({"url": url}, ANA) is True


def test_url_outside_reads_every_named_argument_and_asks_when_none_is_there():
    egress = url_outside(["example.com"], arg=("url", "urls"))
    assert egress({"urls": ["https://example.com/a", "example.com/b"]}, ANA) is False
    assert egress({"url": "https://example.com", "urls": ["https://evil.com"]}, ANA) is True
    assert egress({}, ANA) is True and egress({"url": None}, ANA) is True and egress({"url": 7}, ANA) is True


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        ("example.com", "must be a list of entries, not one string"),
        ([], "names nothing, so every call would ask"),
        (["example.com/path"], "'example.com/path' is not a host name"),
        (["@example.com"], "'@example.com' is not a host name"),
        (["exa_mple.com"], "'exa_mple.com' is not a host name"),
        (["*.com"], "'*.com' must be '*.' and a domain of two labels or more"),
        (["ftp://example.com"], "'ftp://example.com' is not an http(s) URL prefix"),
        (["https://example.com/?q=1"], "is not an http(s) URL prefix"),
        (["https://user@example.com"], "is not an http(s) URL prefix"),
        ([3], "3 is not a string"),
    ],
)
def test_url_outside_refuses_an_entry_that_is_no_host_or_url_by_name(allowed, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        url_outside(allowed)


RECIPIENTS = recipients_outside(
    domains=["example.com", "*.corp.example"], directory=["Bob@Partner.org"], arg=("recipients", "cc")
)


@pytest.mark.parametrize(
    ("args", "asks"),
    [
        ({"recipients": ["ana@example.com"]}, False),
        ({"recipients": "Ana <ana@EXAMPLE.com>, bob@partner.org,"}, False),
        ({"recipients": ["x@mail.corp.example"], "cc": None}, False),
        ({"recipients": ["eve@evil.com"]}, True),
        ({"recipients": ["ana@example.com"], "cc": ["eve@evil.com"]}, True),
        ({"recipients": ["x@example.com.evil.com"]}, True),
        ({"recipients": ["carol@partner.org"]}, True),  # the directory lists addresses, not domains
        ({"recipients": ["not an address"]}, True),
        ({"recipients": ["a@b@example.com"]}, True),
        ({"recipients": []}, True),
        ({}, True),
        ({"recipients": [{"to": "ana@example.com"}]}, True),
    ],
)
def test_recipients_outside_asks_unless_every_recipient_is_inside_the_domains_or_the_directory(args, asks):
    assert RECIPIENTS(args, ANA) is asks


def test_a_recipient_directory_may_be_a_lookup():
    known = recipients_outside(directory=lambda address: address.endswith("@partner.org"), arg="to")
    assert known({"to": "Bob@PARTNER.org"}, ANA) is False and known({"to": "eve@evil.com"}, ANA) is True


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "no domains, no directory"),
        ({"domains": ["https://example.com"]}, "'https://example.com' is not a domain"),
        ({"domains": ["10.0.0.1"]}, "'10.0.0.1' is not a domain"),
        ({"domains": "example.com"}, "not one string"),
        ({"directory": ["nobody"]}, "'nobody' is not an e-mail address"),
        ({"directory": "a@example.com"}, "not one string"),
        ({"domains": ["example.com"], "arg": ""}, "argument names must be one or more non-empty strings"),
    ],
)
def test_recipients_outside_refuses_a_bad_configuration_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        recipients_outside(**config)


PAYEES = counterparty_unknown({"DE89 3704": "Landlord Ltd", 1001: "Bakery"}, id_arg="iban", name_arg="name")


@pytest.mark.parametrize(
    ("args", "asks"),
    [
        ({"iban": "DE89 3704"}, False),
        ({"iban": 1001}, False),
        ({"name": "landlord   LTD"}, False),
        ({"iban": "DE89 3704", "name": "Landlord Ltd"}, False),
        ({"iban": "DE89 3704", "name": "Bakery"}, True),  # a known name with another party's account
        ({"iban": "XX00"}, True),
        ({"name": "Stranger"}, True),
        ({"iban": ["DE89 3704"]}, True),
        ({"name": ""}, True),
        ({}, True),
    ],
)
def test_counterparty_unknown_asks_unless_the_id_and_the_name_are_one_known_party(args, asks):
    assert PAYEES(args, ANA) is asks


def test_counterparty_unknown_takes_a_list_of_ids():
    known = counterparty_unknown(["acct-1", "acct-2"], id_arg="to")
    assert known({"to": "acct-2"}, ANA) is False and known({"to": "acct-3"}, ANA) is True


@pytest.mark.parametrize(
    ("known", "config", "message"),
    [
        ({"a": "A"}, {}, "needs id_arg, name_arg or both"),
        ({}, {"id_arg": "to"}, "names nothing"),
        ("acct-1", {"id_arg": "to"}, "not one string"),
        (["acct-1"], {"name_arg": "name"}, "lists ids only: give a mapping id -> name"),
        ({"a": " "}, {"id_arg": "to"}, "the name of 'a' is not a non-empty string"),
        ({None: "A"}, {"id_arg": "to"}, "the id None is not a non-empty string or an integer"),
    ],
)
def test_counterparty_unknown_refuses_a_bad_configuration_by_name(known, config, message):
    with pytest.raises(ValueError, match=message):
        counterparty_unknown(known, **config)


def test_not_own_asks_unless_every_resource_is_the_requesters():
    owner = not_own("owner")
    assert owner({"owner": "ana"}, ANA) is False
    assert owner({"owner": "bob"}, ANA) is True and owner({"owner": "ana"}, NOBODY) is True
    assert owner({}, ANA) is True and owner({"owner": {"id": "ana"}}, ANA) is True
    files = not_own("file_ids", owner_of={"f1": "ana", "f2": "bob", 3: "ana"}.get)
    assert files({"file_ids": ["f1", 3]}, ANA) is False
    assert files({"file_ids": ["f1", "f2"]}, ANA) is True and files({"file_ids": ["f9"]}, ANA) is True


def test_any_of_asks_when_one_asks_and_needs_conditions():
    either = any_of(not_own("owner"), url_outside(["example.com"]))
    assert either({"owner": "ana", "url": "https://example.com"}, ANA) is False
    assert either({"owner": "ana", "url": "https://evil.com"}, ANA) is True
    with pytest.raises(ValueError, match="one or more conditions"):
        any_of()
    with pytest.raises(ValueError, match="each a callable"):
        any_of("always")  # type: ignore[arg-type]


def test_ask_when_never_weakens_a_policy():
    fetch = url_outside(["example.com"])
    assert ask_when(ToolPolicy(approval="always"), fetch).approval == "always"
    read = ask_when(ToolPolicy(effect="read", approval="never"), fetch)
    assert read.effect == "read" and read.approval is fetch
    both = ask_when(ToolPolicy(approval=lambda args, context: args.get("amount", 0) > 100), fetch)
    assert both.needs_approval({"amount": 500, "url": "https://example.com"}, ANA)
    assert both.needs_approval({"amount": 5, "url": "https://evil.com"}, ANA)
    assert not both.needs_approval({"amount": 5, "url": "https://example.com"}, ANA)
    with pytest.raises(ValueError, match="needs a condition"):
        ask_when(ToolPolicy(), "never")  # type: ignore[arg-type]


def test_a_condition_that_raises_makes_the_policy_ask():
    lookup = not_own("file_id", owner_of=lambda file_id: {"f1": "ana"}[file_id])
    assert not ToolPolicy(approval=lookup).needs_approval({"file_id": "f1"}, ANA)
    assert ToolPolicy(approval=lookup).needs_approval({"file_id": "f404"}, ANA)


def answers(out: dict[str, Any]) -> dict[str, Any]:
    return {m.tool_call_id: json.loads(m.content) for m in out["messages"] if isinstance(m, ToolMessage)}


def test_egress_on_a_trusted_mcp_read_runs_inside_and_asks_outside(db):
    """`ask_when` on `mcp_policies`: a trusted server's read-only fetch runs alone inside the allowlist and asks a
    person outside it; the untrusted server's same tool stays a gated write."""
    fetched: list[str] = []

    @tool
    def fetch(url: str) -> dict[str, str]:
        """Fetch a web page (read)."""
        fetched.append(url)
        return {"url": url, "text": "page"}

    fetch.metadata = {"readOnlyHint": True}
    egress = url_outside(["docs.example.com"])
    assert ask_when(mcp_policies([fetch])["fetch"], egress).approval == "always"  # untrusted: still gated
    policies = {"fetch": ask_when(mcp_policies([fetch], trusted=True)["fetch"], egress)}
    script = [
        reply(calls=[call("fetch", {"url": "https://docs.example.com/a"}, "in")]),
        reply(calls=[call("fetch", {"url": "https://evil.example.net/?q=secrets"}, "out")]),
        reply("done"),
    ]
    cfg = {"configurable": {"thread_id": "egress"}}
    with open_sqlite(db) as saver:
        graph = build_graph(ScriptedChatModel(script=script), [fetch], policies=policies, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "read the docs")]}, cfg)
        assert fetched == ["https://docs.example.com/a"]
        assert [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]] == ["out"]
        out = graph.invoke(Command(resume={"decisions": [{"type": "reject", "message": "not that site"}]}), cfg)
    assert fetched == ["https://docs.example.com/a"] and out["status"] == "completed"
    assert answers(out)["out"]["error"]["type"] == "rejected_by_reviewer"


def test_refuse_when_makes_a_condition_a_hard_rule_for_the_requester(db):
    deleted: list[str] = []

    @tool
    def delete_file(owner: str, name: str) -> dict[str, str]:
        """Delete a file (write)."""
        deleted.append(f"{owner}/{name}")
        return {"deleted": name}

    policy = ToolPolicy(approval="never", validator=refuse_when(not_own("owner"), "You may delete only your files."))
    script = [
        reply(calls=[call("delete_file", {"owner": "bob", "name": "a"}, "theirs")]),
        reply(calls=[call("delete_file", {"owner": "ana", "name": "b"}, "mine")]),
        reply("done"),
    ]
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=script), [delete_file], policies={"delete_file": policy}, checkpointer=saver
        )
        out = graph.invoke({"messages": [("user", "clean up")]}, {"configurable": {"thread_id": "own"}}, context=ANA)
    assert deleted == ["ana/b"] and out["status"] == "completed"
    assert answers(out)["theirs"]["error"] == {
        "type": "permission_denied",
        "message": "You may delete only your files.",
        "retryable": False,
    }
    with pytest.raises(ValueError, match="the reason the model is shown"):
        refuse_when(not_own(), " ")


NAMES = ("url_outside", "recipients_outside", "counterparty_unknown", "not_own", "any_of", "ask_when", "refuse_when")


def test_the_conditions_come_with_the_one_import_for_users():
    import gatedloop.graph
    import gatedloop.tools
    from gatedloop.tools import conditions

    assert gatedloop.graph.conditions is conditions
    assert all(getattr(gatedloop.tools, name) is getattr(conditions, name) for name in NAMES)
