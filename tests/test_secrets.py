"""Secret arguments (`ToolPolicy.secret_args`): masked wherever arguments are shown or logged (issue 10, finding 7)."""

from __future__ import annotations

from typing import Any

import pytest

from gatedloop.tools import ToolPolicy
from gatedloop.tools.policy import MASK, RAW_ARGS

SECRET = ToolPolicy(secret_args=frozenset({"password", "card"}))


def test_masked_hides_each_named_argument_whole_and_keeps_the_others():
    args = {"user": "ana", "password": "hunter2", "card": {"number": "4111", "cvc": 123}, "amount": 5}
    shown = SECRET.masked(args)
    assert shown == {"user": "ana", "password": MASK, "card": MASK, "amount": 5}
    assert args["password"] == "hunter2" and args["card"] == {"number": "4111", "cvc": 123}, "the input is not changed"


def test_masked_matches_top_level_parameters_only():
    # secret_args names the tool's parameters; a nested field of the same name is not a parameter.
    assert SECRET.masked({"login": {"password": "x"}}) == {"login": {"password": "x"}}


def test_masked_without_secrets_is_a_plain_copy():
    args = {"password": "x"}
    shown = ToolPolicy().masked(args)
    assert shown == args and shown is not args


@pytest.mark.parametrize("raw", ['{"password": "hunter2"', "password=hunter2", None])
def test_unparsed_argument_text_of_a_tool_with_secrets_is_masked_whole(raw: Any):
    assert SECRET.masked({RAW_ARGS: raw}) == {RAW_ARGS: MASK}
    assert ToolPolicy().masked({RAW_ARGS: raw}) == {RAW_ARGS: raw}


@pytest.mark.parametrize("forged", ["password=hunter2", ["hunter2"], 7])
def test_arguments_that_are_not_an_object_are_shown_as_unparsed_text_never_raise(forged: Any):
    assert SECRET.masked(forged) == {RAW_ARGS: MASK}
    assert ToolPolicy().masked(forged) == {RAW_ARGS: forged}
