"""The edit form of a call, from its tool's argument schema (what the model sees), and the typed values back.

One input per argument: text for strings, number inputs for integers and numbers, a checkbox for booleans, and a
JSON text area for anything else (objects, lists, unions). Values that do not parse are refused with the field's
name; the tool's own checks run again when the edit reaches the graph.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.tools import BaseTool


class FormError(ValueError):
    """A form value that cannot be turned into the argument's type."""


@dataclass(frozen=True)
class FormField:
    name: str
    kind: str  # "text", "integer", "number", "boolean", "json"
    value: str
    required: bool
    title: str
    description: str
    choices: tuple[str, ...] = ()
    secret: bool = False  # shown empty; left empty, the call keeps its value

    def changed(self, submitted: str | None, form_sent: bool) -> bool:
        """Whether the reviewer changed this field from what the form showed. `form_sent`: the request carried
        this call's argument fields at all (a client that sends none changed nothing); then an unchecked box is
        the one field a browser leaves out. Browsers send textareas with CRLF line ends; an empty secret is
        "keep it"."""
        if not form_sent:
            return False
        if self.kind == "boolean":
            return (submitted not in (None, "", "false", "off")) != (self.value == "true")
        if submitted is None:
            return False
        text = (submitted or "").replace("\r\n", "\n")
        if self.secret:
            return text != ""
        return text.strip() != self.value.strip() if self.kind != "text" else text != self.value


def _schema(tool: BaseTool) -> dict[str, Any]:
    schema: Any = tool.tool_call_schema  # excludes injected arguments such as idempotency_key
    if isinstance(schema, dict):
        return schema
    return schema.model_json_schema() if hasattr(schema, "model_json_schema") else schema.schema()


def _kind(spec: Mapping[str, Any]) -> str:
    kind = spec.get("type")
    if kind == "string":
        return "text"
    if kind in ("integer", "number", "boolean"):
        return str(kind)
    return "json"


def _shown(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "text":
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if kind == "boolean":
        return "true" if value else ""
    if kind in ("integer", "number"):
        return str(value)
    return json.dumps(value, ensure_ascii=False, indent=1)


def edit_fields(tool: BaseTool, args: Mapping[str, Any], secret: frozenset[str] = frozenset()) -> list[FormField]:
    """The form for editing a call of `tool`, prefilled with its current arguments; a `secret` argument (shown
    masked) starts empty: left empty, the edit keeps its value (the graph restores a masked value), typed, it
    replaces it."""
    schema = _schema(tool)
    required = set(schema.get("required") or [])
    fields = []
    for name, spec in (schema.get("properties") or {}).items():
        kind = _kind(spec)
        fields.append(
            FormField(
                name=name,
                kind=kind,
                value="" if name in secret else _shown(kind, args.get(name, spec.get("default"))),
                required=name in required,
                title=str(spec.get("title") or name),
                description=("secret: leave empty to keep it, or type a new value. " if name in secret else "")
                + str(spec.get("description") or ""),
                choices=tuple(str(c) for c in spec.get("enum") or ()),
                secret=name in secret,
            )
        )
    return fields


def parse_edit(fields: list[FormField], values: Mapping[str, str]) -> dict[str, Any]:
    """Typed arguments from the submitted form (`values`: argument name -> submitted text)."""
    args: dict[str, Any] = {}
    for f in fields:
        text = values.get(f.name)
        if f.kind == "boolean":
            args[f.name] = text is not None and text not in ("", "false", "off")
            continue
        text = (text or "").strip() if f.kind != "text" else (text or "")
        if text == "" and not f.required:
            continue
        if f.kind == "text":
            args[f.name] = text
        elif f.kind == "integer":
            try:
                args[f.name] = int(text)
            except ValueError:
                raise FormError(f"{f.name}: {text!r} is not a whole number") from None
        elif f.kind == "number":
            try:
                args[f.name] = float(text)
            except ValueError:
                raise FormError(f"{f.name}: {text!r} is not a number") from None
        else:
            try:
                args[f.name] = json.loads(text)
            except json.JSONDecodeError as exc:
                raise FormError(f"{f.name}: not JSON ({exc.msg} at character {exc.pos})") from None
    return args
