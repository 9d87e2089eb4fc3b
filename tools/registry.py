"""The whitelist: which tools exist, under which policy, and how one proposed call is checked.

`read` is the one entry from raw arguments to a checked value (with the tool's strictness); `check_call` is the
single place a read proposal becomes something that may run. Neither raises on bad model output: a refusal is
a `ToolFailure` returned as a value.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.tools import BaseTool
from pydantic import ValidationError

from gatedloop.tools import errors
from gatedloop.tools.arguments import CallArguments, UnreadArguments, digest, read_arguments, safe_text, storable_text
from gatedloop.tools.blocking import call_blocking
from gatedloop.tools.injection import COMMAND_REFUSED, Injections, injections, returns_only_commands
from gatedloop.tools.policy import GATED_WRITE, CallContext, ToolPolicy

log = logging.getLogger("gatedloop.tools")

IDEMPOTENCY_PARAM = "idempotency_key"


@dataclass(frozen=True)
class CheckedCall:
    """A proposal that passed the whitelist, the schema and the business checks."""

    args: dict[str, Any]
    repair: str | None = None


class ToolRegistry:
    """Tools by exact name, each with its policy (fail closed: no policy means a gated write)."""

    def __init__(self, tools: Sequence[BaseTool], policies: Mapping[str, ToolPolicy] | None = None):
        policies = dict(policies or {})
        self.tools: dict[str, BaseTool] = {}
        for item in tools:
            if not isinstance(item, BaseTool):
                raise TypeError(f"tools must be LangChain tools (@tool or BaseTool), got {type(item).__name__}")
            if item.name in self.tools:
                raise ValueError(f"two tools share the name {item.name!r}")
            if returns_only_commands(item):
                raise ValueError(COMMAND_REFUSED.format(name=item.name))
            self.tools[item.name] = item
        self.injections: dict[str, Injections] = {name: injections(tool) for name, tool in self.tools.items()}
        unknown = set(policies) - set(self.tools)
        if unknown:
            raise ValueError(f"policies name tools that do not exist: {sorted(unknown)}")
        self.policies = {name: policies.get(name, GATED_WRITE) for name in self.tools}
        self._definitions: dict[str, str] = {}
        self._identity: tuple[str, str, dict[str, dict[str, Any]]] | None = None

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def policy(self, name: str) -> ToolPolicy:
        return self.policies[name]

    def definition_digest(self, name: str) -> str:
        """A digest of what the model and the reviewer were told the tool is: its name, description, argument
        schema and annotations (`metadata`, where MCP tools keep their hints). A call pins it when validated;
        a call whose tool changed since (a redeploy, an MCP server that changed the tool) is not run."""
        found = self._definitions.get(name)
        if found is None:
            tool = self.tools[name]
            schema: Any = tool.tool_call_schema
            shown = schema if isinstance(schema, dict) else schema.model_json_schema()
            found = digest([name, tool.description, shown, storable_text(tool.metadata or {})])
            self._definitions[name] = found
        return found

    def identity_digests(self) -> tuple[str, str, dict[str, dict[str, Any]]]:
        """A digest of all the tools' definitions, one of their policies (`ToolPolicy.summary`) and those
        summaries: the part of a graph's identity its registry makes (`gatedloop.graph.parts_of.graph_identity`),
        which every run checks. Computed once, as `definition_digest` is: tools and policies do not change."""
        if self._identity is None:
            names = sorted(self.tools)
            policies = {name: self.policy(name).summary() for name in names}
            tools = digest([self.definition_digest(name) for name in names])
            self._identity = (tools[:16], digest(policies)[:16], policies)
        return self._identity

    def takes_idempotency_key(self, name: str) -> bool:
        schema = self.tools[name].args_schema
        fields = getattr(schema, "model_fields", None)
        if fields is not None:
            return IDEMPOTENCY_PARAM in fields
        return isinstance(schema, dict) and IDEMPOTENCY_PARAM in schema.get("properties", {})

    def read(self, name: Any, raw_args: Any) -> CallArguments:
        """Raw arguments read once (`read_arguments`), strictly or tolerantly as the tool's policy says (strictly
        for a name that is no tool: it is refused anyway)."""
        known = isinstance(name, str) and name in self.tools
        return read_arguments(raw_args, strict=self.policies[name].strict if known else True)

    def check_call(self, name: Any, arguments: CallArguments, context: CallContext) -> CheckedCall | errors.ToolFailure:
        """Whitelist, arguments (exact values only: `argument_problem`), schema, roles, business checks: in that
        order, first failure wins. Validators and approval predicates never see an inexact value."""
        if not isinstance(name, str) or name not in self.tools:
            message = errors.UNKNOWN_TOOL.format(name=safe_text(str(name)[:80]), available=", ".join(self.tools))
            return errors.ToolFailure(message, error_type="unknown_tool")
        policy = self.policies[name]
        if isinstance(arguments, UnreadArguments):  # includes inexact values: NaN, deep nesting, lone surrogates...
            return errors.invalid_arguments(errors.INVALID_JSON.format(detail=arguments.problem))
        problem = self._schema_problem(name, arguments.args)
        if problem:
            return errors.invalid_arguments(errors.SCHEMA_MISMATCH.format(detail=problem))
        if policy.roles is not None and not (policy.roles & context.roles):
            message = f"Calling {name} needs one of the roles: {sorted(policy.roles)}."
            return errors.ToolFailure(message, error_type="permission_denied")
        if policy.validator is not None:
            refusal = _run_validator(policy, name, arguments.args, context)
            if refusal:
                return refusal
        return CheckedCall(arguments.args, arguments.repair)

    def _schema_problem(self, name: str, args: dict[str, Any]) -> str | None:
        """Validate against what the model was shown; unknown keys are refused so nothing unseen runs."""
        schema = self.tools[name].tool_call_schema
        if IDEMPOTENCY_PARAM in args and self.takes_idempotency_key(name):
            return f"{IDEMPOTENCY_PARAM!r} is supplied by gatedloop, not by the model"
        if isinstance(schema, dict):
            allowed = set(schema.get("properties", {}))
            missing = [k for k in schema.get("required", []) if k not in args]
            extra = sorted(set(args) - allowed)
            if extra:
                return f"unknown argument(s) {extra}; expected {sorted(allowed)}"
            return f"missing required argument(s) {missing}" if missing else None
        model = cast(Any, schema)
        extra = sorted(set(args) - set(model.model_fields))
        if extra:
            return f"unknown argument(s) {extra}; expected {sorted(model.model_fields)}"
        try:
            model.model_validate(args)
        except ValidationError as exc:
            return "; ".join(_describe(e) for e in exc.errors()[:5])
        return None

    def bindable(self) -> list[BaseTool]:
        return list(self.tools.values())


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
    return f"{where}: {error.get('msg', 'invalid')}"


def _run_validator(
    policy: ToolPolicy, name: str, args: dict[str, Any], context: CallContext
) -> errors.ToolFailure | None:
    assert policy.validator is not None
    try:
        reason = call_blocking(policy.validator, args, context)
    except errors.ToolFailure as exc:
        return exc  # its own message, type and retryable, as when a tool raises it
    except Exception:
        log.exception("validator for %s raised; refusing the call", name)
        return errors.ToolFailure("The call could not be checked; it was not run.", error_type="tool_error")
    if reason:
        return errors.invalid_arguments(str(reason))
    return None


def describe_tool(tool: BaseTool) -> str:
    return (tool.description or inspect.getdoc(tool) or tool.name).strip().splitlines()[0]
