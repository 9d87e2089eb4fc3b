"""The auth configuration of gatedloop.graph.auth: where it is read from, what it accepts, and the one error a bad
one gives (naming the setting and the problem, never a token). The server side is in test_server_auth.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import Auth

from gatedloop.graph.auth import FILE_ENV, TOKENS_ENV, AuthConfigError, build_auth, load_auth_config

ROOT = Path(__file__).parent.parent

ANA = "ana-token-7f3c9e1d2b"
BO = "bo-token-1d6f2a9e3c"
GOOD = {
    "supervisor_roles": ["finance"],
    "tokens": {
        ANA: {"user_id": "ana", "roles": ["staff"]},
        "sha256:" + hashlib.sha256(BO.encode()).hexdigest(): {"user_id": "bo", "roles": ["finance"]},
    },
}


def test_langgraph_json_ships_this_auth_without_studio_s_bypass() -> None:
    block = json.loads((ROOT / "langgraph.json").read_text())["auth"]
    module, _, attr = block["path"].partition(":")
    assert isinstance(getattr(__import__(module, fromlist=[attr]), attr), Auth)
    assert block["disable_studio_auth"] is True  # else langgraph dev admits `x-auth-scheme: langsmith` unchecked


def test_tokens_map_to_users_and_roles_plain_or_hashed() -> None:
    config = load_auth_config({TOKENS_ENV: json.dumps(GOOD)})
    assert config is not None
    ana, bo = config.user_for(ANA), config.user_for(BO)
    assert ana is not None and (ana.user_id, ana.roles) == ("ana", frozenset({"staff"}))
    assert bo is not None and (bo.user_id, bo.roles) == ("bo", frozenset({"finance"}))
    assert config.user_for(ANA + "x") is None and config.user_for("") is None
    assert config.user_for("sha256:" + hashlib.sha256(BO.encode()).hexdigest()) is None  # the digest is no token
    assert [config.is_supervisor(u) for u in ("ana", "bo", "nobody")] == [False, True, False]
    assert ANA not in repr(config)


def test_the_file_variant_and_the_unconfigured_fallback(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(GOOD))
    config = load_auth_config({FILE_ENV: str(path)})
    assert config is not None and config.user_for(ANA) is not None
    assert load_auth_config({}) is None
    with pytest.raises(AuthConfigError, match=rf"\({FILE_ENV}=.*missing.json\): cannot read the file: .*No such file"):
        load_auth_config({FILE_ENV: str(tmp_path / "missing.json")})
    with pytest.raises(AuthConfigError, match=f"set {TOKENS_ENV} or {FILE_ENV}, not both"):
        load_auth_config({FILE_ENV: str(path), TOKENS_ENV: json.dumps(GOOD)})


def tokens(*entries: tuple[str, Any]) -> dict[str, Any]:
    return {"tokens": dict(entries)}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "it is empty; unset it for the local single-user mode"),
        ('{"tokens": {', "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 13"),
        (tokens(), "tokens: List should have at least 1 item|tokens: Dictionary should have at least 1 item"),
        ({}, "tokens: Field required"),
        ([1], "Input should be a valid dictionary"),
        ({**GOOD, "approvers": ["finance"]}, "approvers: Extra inputs are not permitted"),
        (tokens((ANA, {"user_id": "ana", "roles": "finance"})), r"tokens\.entry #1\.roles: Input should be a valid"),
        (tokens((ANA, {"user_id": ""})), r"tokens\.entry #1\.user_id: String should have at least 1 character"),
        (tokens((ANA, {"user_id": "ana", "roles": [" finance"]})), r"tokens\.entry #1\.roles\.0: String should match"),
        (tokens((ANA, {"user": "ana"})), r"tokens\.entry #1\.user_id: Field required; tokens\.entry #1\.user: Extra"),
        (
            tokens((ANA, {"user_id": "ana"}), ("short", {"user_id": "cy"})),
            r"tokens: entry #2 \(user 'cy'\): a token needs at least 16 characters and no whitespace",
        ),
        (
            tokens((ANA, {"user_id": "ana"}), ("sha256:" + hashlib.sha256(ANA.encode()).hexdigest(), {"user_id": "x"})),
            r"tokens: entry #2 \(user 'x'\): the same token is listed twice",
        ),
        (
            tokens(("sha256:abc", {"user_id": "ana"})),
            "tokens: entry #1 .*: a hashed key is 'sha256:' and 64 lowercase hex",
        ),
        (
            tokens((ANA, {"user_id": "ana", "roles": ["staff"]}), (BO, {"user_id": "ana", "roles": ["finance"]})),
            r"tokens: entry #2 \(user 'ana'\): this user has another token with different roles",
        ),
    ],
)
def test_a_bad_config_is_one_error_naming_the_problem_and_no_token(text: Any, problem: str) -> None:
    raw = text if isinstance(text, str) else json.dumps(text)
    with pytest.raises(AuthConfigError, match=rf"^gatedloop auth config \({TOKENS_ENV}\): ({problem})") as caught:
        load_auth_config({TOKENS_ENV: raw})
    assert ANA not in str(caught.value) and BO not in str(caught.value)


def authenticate(config: Any, headers: Any, *, by_name: bool) -> Any:
    """The token handler as each server calls it: langgraph-api by parameter name with the raw ASGI headers
    (`{bytes: bytes}`), Aegra positionally with text headers (aegra_api.core.auth_middleware)."""
    handler = build_auth(config)._authenticate_handler
    assert handler is not None
    return asyncio.run(handler(headers=headers) if by_name else handler(headers))


def raw(headers: dict[str, str]) -> dict[bytes, bytes]:
    return {k.lower().encode(): v.encode() for k, v in headers.items()}


@pytest.mark.parametrize("by_name", [True, False], ids=["langgraph-api", "aegra"])
def test_a_token_in_authorization_or_in_agent_chat_uis_x_api_key(by_name: bool) -> None:
    config = load_auth_config({TOKENS_ENV: json.dumps(GOOD)})
    accepted = [
        {"authorization": f"Bearer {BO}"},
        {"x-api-key": BO},
        {"Authorization": f"bearer {BO}", "X-Api-Key": BO},
    ]
    for headers in accepted:
        sent = raw(headers) if by_name else headers
        user = authenticate(config, sent, by_name=by_name)
        assert (user["identity"], user["roles"]) == ("bo", ["finance"])
    refused = [
        ({}, "send 'Authorization: Bearer <token>' (or 'X-Api-Key: <token>')"),
        ({"x-api-key": "  "}, "send 'Authorization"),
        ({"authorization": BO}, "send 'Authorization"),  # no scheme
        ({"x-api-key": BO + "x"}, "unknown token"),
        ({"authorization": f"Bearer {ANA}", "x-api-key": BO}, "Authorization and X-Api-Key carry different tokens"),
    ]
    for headers, detail in refused:
        with pytest.raises(Auth.exceptions.HTTPException) as caught:
            authenticate(config, raw(headers) if by_name else headers, by_name=by_name)
        assert caught.value.status_code == 401 and str(caught.value.detail).startswith(detail)


@pytest.mark.parametrize("by_name", [True, False], ids=["langgraph-api", "aegra"])
def test_the_unconfigured_local_user_under_either_server(by_name: bool) -> None:
    user = authenticate(None, {}, by_name=by_name)
    assert user["identity"] == "local"


def test_supervisor_roles_old_name_is_read_with_a_warning_and_both_names_are_refused(caplog) -> None:
    """Issue 30's one word per idea: the roles that see every thread are `supervisor_roles` ("approvers" is only a
    tool's deciding roles); the old key still works in this release."""
    tokens = {"bo-token-0123456789ab": {"user_id": "bo", "roles": ["finance"]}}
    with caplog.at_level(logging.WARNING, logger="gatedloop.auth"):
        old = load_auth_config({TOKENS_ENV: json.dumps({"approver_roles": ["finance"], "tokens": tokens})})
    assert old is not None and old.is_supervisor("bo") and "now called supervisor_roles" in caplog.text
    new = load_auth_config({TOKENS_ENV: json.dumps({"supervisor_roles": ["finance"], "tokens": tokens})})
    assert new is not None and new.is_supervisor("bo")
    both = {"supervisor_roles": ["finance"], "approver_roles": ["ops"], "tokens": tokens}
    with pytest.raises(AuthConfigError, match="approver_roles is the old name of supervisor_roles"):
        load_auth_config({TOKENS_ENV: json.dumps(both)})
