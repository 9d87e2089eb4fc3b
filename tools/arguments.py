"""Turning a model's raw tool-call arguments into a checked dict, and fingerprinting them.

Writes get strict JSON. Reads may be repaired from common damage (code fences, prose around one JSON
object); the repair is reported so it can be recorded. Digests bind approvals to exact arguments.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


class ArgumentsError(ValueError):
    """The arguments could not be read as one JSON object; the message says why, safely."""


@dataclass(frozen=True)
class ParsedArguments:
    """Arguments read as exact JSON data (`argument_problem` found nothing), and how they were repaired, if at all."""

    args: dict[str, Any]
    repair: str | None = None


@dataclass(frozen=True)
class UnreadArguments:
    """Arguments that are not one exact JSON object: the text as received (storable: see `storable_text`) and why."""

    text: str
    problem: str


CallArguments = ParsedArguments | UnreadArguments
"""A call's arguments, read once: what `validate` checks, `approve` shows and `execute` runs."""


def read_arguments(raw: Any, *, strict: bool) -> CallArguments:
    """The one entry from raw arguments (a model's text or dict, a reviewer's edit) to a checked value: one exact
    JSON object (see `argument_problem`); tolerant mode repairs fences and surrounding prose. A dict is checked,
    not re-parsed. Never raises, whatever the input."""
    try:
        parsed = _parse(raw, strict=strict)
    except ArgumentsError as exc:
        return UnreadArguments(_as_text(raw), str(exc))
    problem = argument_problem(parsed.args)
    if problem:
        return UnreadArguments(_as_text(raw), problem)
    return parsed


def _as_text(raw: Any) -> str:
    return safe_text(raw) if isinstance(raw, str) else storable_text(raw)


def _parse(raw: Any, *, strict: bool) -> ParsedArguments:
    if isinstance(raw, dict):
        return ParsedArguments(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return ParsedArguments({})
    if not isinstance(raw, str):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(raw).__name__}")
    stand_in = _NOT_KEPT.match(raw)
    if stand_in:
        raise ArgumentsError(stand_in.group(1))
    if text_nested_deeper_than(raw, MAX_DEPTH):
        raise ArgumentsError(f"arguments {TOO_DEEP}")
    try:
        return ParsedArguments(_object(_loads(raw)))
    except json.JSONDecodeError as exc:
        if strict:
            raise ArgumentsError(f"invalid JSON at position {exc.pos}: {exc.msg}") from None
    fenced = _FENCE.match(raw)
    if fenced:
        try:
            return ParsedArguments(_object(_loads(fenced.group(1))), repair="removed code fence")
        except json.JSONDecodeError:
            pass
    start, end = raw.find("{"), raw.rfind("}")
    if 0 <= start < end:
        try:
            return ParsedArguments(_object(_loads(raw[start : end + 1])), repair="removed text around JSON")
        except json.JSONDecodeError:
            pass
    raise ArgumentsError("no JSON object could be read from the arguments")


def _loads(text: str) -> Any:
    """json.loads; an integer too long for Python to read (about 4,300 digits) is our refusal, not a ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError:
        raise ArgumentsError(INT64_PROBLEM) from None


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


INT64 = 2**63
INT64_PROBLEM = "integers must fit in 64 bits"
MAX_DEPTH = 32
"""Arguments may nest containers this deep (`{"a": [1]}` is 2); deeper is `invalid_arguments`, never a crash."""
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"
ANSWER_DEPTH = MAX_DEPTH + 4
"""A reviewer's answer may nest this deep: edited arguments sit 4 levels down (`{"decisions": [{"edited_action":
{"args": ...}}]}`); the arguments themselves are held to MAX_DEPTH by `approve`. LangGraph stores an answer keyed
by its interrupt id, one level more (`checkpoints/exact.py`)."""


def argument_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """The first reason `value` is not exact JSON data we can check, store and show, or None.

    Refused: non-finite numbers (NaN and infinities: Python's json reads them, and they compare false with
    everything, so a predicate like `amount > 100` passes them), integers beyond 64 bits (LangGraph's
    checkpoint serializer cannot store them), text that is not encodable as UTF-8 (lone surrogates: the
    checkpoint would silently store `?` instead), keys that are not strings, types JSON does not have, and
    nesting deeper than `max_depth`. Walked with an explicit stack, so no input can raise RecursionError.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not -INT64 <= item < INT64:
                return INT64_PROBLEM
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "numbers must be finite (NaN and infinities are not JSON)"
        elif isinstance(item, str):
            if not _encodable(item):
                return "text must be valid Unicode (no lone surrogates)"
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return f"nested deeper than {max_depth} levels"
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        return f"keys must be strings, not {type(key).__name__}"
                    if not _encodable(key):
                        return "keys must be valid Unicode (no lone surrogates)"
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        else:
            return f"values must be JSON data, not {type(item).__name__}"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def nested_deeper_than(value: Any, max_depth: int) -> bool:
    """Whether containers in `value` nest deeper than `max_depth`, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def text_nested_deeper_than(text: str, max_depth: int) -> bool:
    """The same for JSON text, without parsing it (json.loads recurses: deep text raises RecursionError).
    One pass over quotes, escapes and brackets, so any text takes linear time; brackets inside strings do
    not count. Where the text stops being JSON, json.loads stops too, so it never goes deeper than this."""
    depth, in_string = 0, False
    for token in _JSON_TOKENS.findall(text):
        if token == '"':
            in_string = not in_string
        elif in_string or token[0] == "\\":
            continue
        elif token in "[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


_JSON_TOKENS = re.compile(r'\\.|["\[\]{}]', re.DOTALL)
NOT_KEPT = "<arguments not kept: {problem}>"
"""Stands in for arguments that cannot be written as JSON text; reading it back gives the same refusal."""
_NOT_KEPT = re.compile(r"^<arguments not kept: (.+)>$", re.DOTALL)


def storable_text(value: Any) -> str:
    """Arguments as text a checkpoint stores exactly and that reads back to the same refusal: ASCII-escaped
    JSON (NaN, huge integers and lone surrogates survive as text), or a short `NOT_KEPT` stand-in when too
    deep or too large to write."""
    if nested_deeper_than(value, MAX_DEPTH):
        return NOT_KEPT.format(problem=f"arguments {TOO_DEEP}")
    try:
        return json.dumps(value, ensure_ascii=True, default=repr)
    except ValueError:  # an integer past Python's printable size (about 4,300 digits)
        return NOT_KEPT.format(problem=INT64_PROBLEM)
    except TypeError:  # keys JSON cannot have
        return NOT_KEPT.format(problem="keys must be strings")


def safe_text(text: str) -> str:
    """`text`, with anything UTF-8 cannot encode (lone surrogates) written as a backslash escape."""
    return text if _encodable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


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
    if nested_deeper_than(args, MAX_DEPTH):
        return _matches_nothing()
    return digest({"tool": name, "args": canonical(args)})


def digest(value: Any) -> str:
    """A stable SHA-256 over canonical JSON; used to bind an approval to exact arguments.

    Never raises: a value no argument can be (deeper than the cap, an integer too long to print) gets a
    digest that matches nothing, not even itself, so nothing can be approved or matched through it."""
    if nested_deeper_than(value, MAX_DEPTH + 8):
        return _matches_nothing()
    try:
        blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (ValueError, TypeError):  # integers past Python's printable size; keys that cannot be sorted
        return _matches_nothing()
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _matches_nothing() -> str:
    """Not hex (real digests are), and random: equal to no stored or forged digest."""
    return "!" + secrets.token_hex(15)


def args_digest(name: str, args: dict[str, Any]) -> str:
    """Exact (not canonicalized) digest of what would run: a reviewer approves these bytes, nothing close."""
    return digest({"tool": name, "args": args})
