"""`build_graph(..., response_format=...)`: the final answer as a validated structured value.

Done the way LangChain's `create_agent` does with `ToolStrategy`: the schema is bound as one more tool, the model
must call some tool each turn (`tool_choice="any"`), and its final answer is a call to that tool, validated against
the schema. We chose the tool strategy over `ProviderStrategy` (the provider's native JSON mode) because it works
with every tool-calling model LangChain ships, including the scripted and fake models agents are tested with,
and its error channel is the one the loop already has: a ToolMessage the model reads on its retry.

`create_agent`'s own `ToolStrategy(schema)` is taken too (`AnswerFormat.of`), with the options that mean the same
here: `tool_message_content`, and `handle_errors` as True or a message. Its other error handling (False, exception
types, a function of LangChain's exceptions) is refused: gatedloop never raises on a model's answer, it tells the
model why and asks again.

The value stored in `structured_response` is JSON (a pydantic model's `model_dump(mode="json")`), so any
checkpointer stores it and any process (or LangGraph Server) can load it without importing the model class.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ValidationError

from gatedloop.nodes.gate.answers import error_message, tool_message
from gatedloop.tools.arguments import UnreadArguments, read_arguments
from gatedloop.tools.errors import invalid_arguments

ANSWER_TOOL_DESCRIPTION = (
    "Give your final answer with this tool, once and alone, after the other tools you needed have answered. "
    "Its arguments are the answer."
)
ANSWERED = "Returning structured response."
ALONE = "Call {name} alone, once, as your final answer; other tool calls in the same turn were not run."
ANSWER_WITH_TOOL = "Your final answer must be a call to {name} with arguments matching its schema, not text."
INVALID = "The answer does not match the {name} schema: {detail}. Call {name} again with corrected arguments."


@dataclass(frozen=True)
class Judged:
    """A response checked against the answer format: a value to keep, or why not and what to tell the model."""

    value: Any = None
    problem: str | None = None
    feedback: tuple[BaseMessage, ...] = ()


class AnswerFormat:
    """The final answer's schema, bound to the model as one more tool. `answered` is what the model is told when
    its answer is taken; `retry`, when set, what it is told instead of the reason an answer is not."""

    def __init__(
        self, schema: type[BaseModel] | Mapping[str, Any], *, answered: str = ANSWERED, retry: str | None = None
    ):
        self.answered, self.retry = answered, retry
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            self.model: type[BaseModel] | None = schema
            self._validator: Any = None
            tool = convert_to_openai_tool(schema)
        elif isinstance(schema, Mapping):
            import jsonschema  # only JSON-schema answers need it

            try:
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"response_format is not a valid JSON schema: {exc.message}") from None
            if schema.get("type") != "object":
                raise ValueError('response_format (a JSON schema) must describe an object ("type": "object")')
            self.model = None
            self._validator = jsonschema.validators.validator_for(schema)(schema)
            name = str(schema.get("title") or "final_answer")
            parameters = {k: v for k, v in schema.items() if k not in ("title", "description")}
            tool = {"type": "function", "function": {"name": name, "parameters": parameters}}
        else:
            raise TypeError(
                f"response_format must be a pydantic model class or a JSON schema dict, not {type(schema).__name__}"
            )
        tool["function"]["description"] = ANSWER_TOOL_DESCRIPTION
        self.tool: dict[str, Any] = tool
        self.name: str = tool["function"]["name"]

    @classmethod
    def of(cls, response_format: Any) -> AnswerFormat:
        """`build_graph`'s `response_format`: a schema, or LangChain's `ToolStrategy` of one, unwrapped."""
        strategies = sys.modules.get("langchain.agents.structured_output")  # made one: already imported
        if strategies is None or not isinstance(response_format, strategies.ToolStrategy):
            return cls(response_format)
        return cls(response_format.schema, **_tool_strategy_options(response_format))

    def parse(self, args: Any) -> Any:
        """The validated answer as JSON; raises ValueError with a readable reason."""
        if self.model is not None:
            try:
                return self.model.model_validate(args).model_dump(mode="json")
            except ValidationError as exc:
                raise ValueError("; ".join(_describe(e) for e in exc.errors()[:5])) from None
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            raise ValueError("; ".join(f"{'.'.join(map(str, e.path)) or 'answer'}: {e.message}" for e in errors[:5]))
        return args

    def judge(self, response: AIMessage) -> Judged | None:
        """None: the response is an ordinary turn (tool calls to run). Otherwise the final answer, or a problem."""
        calls = [*response.tool_calls, *response.invalid_tool_calls]
        answers = [c for c in calls if c.get("name") == self.name]
        if calls and not answers:
            return None
        if not calls:
            problem = ANSWER_WITH_TOOL.format(name=self.name)
            return Judged(problem=problem, feedback=(response, HumanMessage(problem)))
        if len(calls) > 1:
            problem = self.retry or ALONE.format(name=self.name)
            return Judged(problem=problem, feedback=(response, *(_answer(c, problem, error=True) for c in calls)))
        call = answers[0]
        arguments = read_arguments(call.get("args"), strict=True)
        try:
            if isinstance(arguments, UnreadArguments):
                raise ValueError(f"the arguments are not JSON ({arguments.problem})")
            value = self.parse(arguments.args)
        except ValueError as exc:
            problem = self.retry or INVALID.format(name=self.name, detail=exc)
            return Judged(problem=problem, feedback=(response, _answer(call, problem, error=True)))
        return Judged(value=value, feedback=(response, _answer(call, self.answered, error=False)))


def _tool_strategy_options(strategy: Any) -> dict[str, Any]:
    """A `ToolStrategy`'s options as `AnswerFormat`'s; ValueError for one gatedloop cannot honour."""
    if len(strategy.schema_specs) > 1:
        raise ValueError(
            "response_format=ToolStrategy(a union of schemas) is not supported: the final answer is one schema; "
            "make the alternatives a field of one model"
        )
    handle = strategy.handle_errors
    if handle is not True and not isinstance(handle, str):
        raise ValueError(
            f"response_format=ToolStrategy(handle_errors={handle!r}) is not supported: gatedloop never raises on a "
            "model's answer; an invalid one is told to the model, which answers again (handle_errors=True, or a "
            "message to tell it), until Limits.model_retries ends the request with status invalid_answer"
        )
    return {
        "answered": strategy.tool_message_content or ANSWERED,
        "retry": handle if isinstance(handle, str) else None,
    }


def _answer(call: Any, text: str, *, error: bool) -> ToolMessage:
    call_id = call.get("id") or ""
    if error:
        return error_message(call_id, call.get("name"), invalid_arguments(text))
    return tool_message(call_id, call.get("name"), "ok", text)


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "answer"
    return f"{where}: {error.get('msg', 'invalid')}"
