"""Turning a model's raw tool-call arguments into a checked dict, and fingerprinting them.

Writes get strict JSON. Reads may be repaired from common damage (code fences, prose around one JSON
object); the repair is reported so it can be recorded. Digests bind approvals to exact arguments.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


class ArgumentsError(ValueError):
    """The arguments could not be read as one JSON object; the message says why, safely."""


@dataclass(frozen=True)
class ParsedArguments:
    args: dict[str, Any]
    repair: str | None = None


def parse_arguments(raw: str | dict[str, Any] | None, *, strict: bool) -> ParsedArguments:
    """Read raw arguments as a JSON object; tolerant mode repairs fences and surrounding prose."""
    if isinstance(raw, dict):
        return ParsedArguments(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return ParsedArguments({})
    if not isinstance(raw, str):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(raw).__name__}")
    try:
        return ParsedArguments(_object(json.loads(raw)))
    except json.JSONDecodeError as exc:
        if strict:
            raise ArgumentsError(f"invalid JSON at position {exc.pos}: {exc.msg}") from None
    fenced = _FENCE.match(raw)
    if fenced:
        try:
            return ParsedArguments(_object(json.loads(fenced.group(1))), repair="removed code fence")
        except json.JSONDecodeError:
            pass
    start, end = raw.find("{"), raw.rfind("}")
    if 0 <= start < end:
        try:
            return ParsedArguments(_object(json.loads(raw[start : end + 1])), repair="removed text around JSON")
        except json.JSONDecodeError:
            pass
    raise ArgumentsError("no JSON object could be read from the arguments")


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


INT64 = 2**63


def out_of_range(value: Any) -> bool:
    """Integers beyond 64 bits: valid JSON, but LangGraph's checkpoint serializer (msgpack) cannot store them."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -INT64 <= value < INT64
    if isinstance(value, dict):
        return any(out_of_range(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(out_of_range(v) for v in value)
    return False


def canonical(value: Any) -> Any:
    """Normalize for comparison: sorted keys (via json), equal numbers equal (1 == 1.0), NaN kept distinct."""
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def fingerprint(name: str, args: dict[str, Any]) -> str:
    """Same tool + same arguments (up to key order, whitespace and equal numbers) -> same fingerprint."""
    return digest({"tool": name, "args": canonical(args)})


def digest(value: Any) -> str:
    """A stable SHA-256 over canonical JSON; used to bind an approval to exact arguments."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def args_digest(name: str, args: dict[str, Any]) -> str:
    """Exact (not canonicalized) digest of what would run: a reviewer approves these bytes, nothing close."""
    return digest({"tool": name, "args": args})
