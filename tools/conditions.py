"""Conditions for `ToolPolicy(approval=...)`: the checks teams keep writing, as pure predicates.

Each factory checks its configuration when it is called (a bad entry raises `ValueError` naming it) and returns a
predicate `(args, context) -> bool`, True when a person must approve the call, as `approval=` takes it:

- `url_outside`: egress, a read that reaches the network outside an allowlist of hosts and URL prefixes;
- `recipients_outside`: a recipient outside given domains and not in a directory;
- `counterparty_unknown`: a counterparty that is not a known one, by id or by name;
- `not_own`: a resource that is not the requester's own.

What a predicate cannot read (its argument missing or of another type, a URL or an address it cannot parse) asks:
fail closed, as `ToolPolicy.needs_approval` treats a predicate that raises. They read only the arguments and the
context (`CallContext`, the requester), because the gate runs them again before the call runs and must get the
same answer. `any_of` joins conditions, `ask_when` adds one to a policy that exists (one from `mcp_policies`, say)
and never makes it weaker, and `refuse_when` makes one a hard rule (a `validator`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from gatedloop.tools.errors import ToolFailure
from gatedloop.tools.policy import ApprovalPredicate, CallContext, ToolPolicy, Validator

DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)\Z")
_NAMED_ADDRESS = re.compile(r"[^<>@]*<([^<>]+)>\Z")
NAMES_NOTHING = "{where} names nothing, so every call would ask: use approval='always' instead"


def url_outside(allowed: Iterable[str], *, arg: str | Sequence[str] = "url") -> ApprovalPredicate:
    """Egress: ask when the URL in `arg` (a string or a list of them; several argument names may be given) is
    outside `allowed`. An entry is a host (`example.com`: that host only; `*.example.com`: its subdomains; an IP
    address), which covers http, https and a value without a scheme (`www.example.com/page`) on any port; or an
    http(s) URL prefix (`https://api.example.com/v1`: that scheme, host and port, the path `/v1` and below).

    Outside, whatever the entries: another scheme, user info (`https://example.com@evil.com`), a backslash or
    whitespace anywhere (parsers disagree on them), a host that is no host name, and under a prefix entry a path
    with `.` or `..` segments (encoded or not)."""
    hosts, prefixes = _allowlist(allowed, "url_outside(allowed)", urls=True)
    names = _arg_names(arg)

    def outside(args: dict[str, Any], context: CallContext) -> bool:
        urls = _values(args, names, (str,))
        return urls is None or not all(_url_inside(url, hosts, prefixes) for url in urls)

    return outside


def recipients_outside(
    *,
    domains: Iterable[str] = (),
    directory: Iterable[str] | Callable[[str], bool] = (),
    arg: str | Sequence[str] = "recipients",
) -> ApprovalPredicate:
    """Ask when any recipient is outside `domains` (hosts as in `url_outside`: `example.com`, `*.example.com`) and
    not in `directory` (addresses, or a function of a lower-case address that says whether it is known). Every
    address in the named arguments counts (`arg=("to", "cc", "bcc")`): plain (`ana@example.com`) or named
    (`Ana <ana@example.com>`), several in one string separated by commas, or a list. No address at all, or text
    that is no address, asks."""
    hosts, _ = _allowlist(domains, "recipients_outside(domains)", urls=False, empty_ok=True)
    known = directory if callable(directory) else _directory(directory)
    if not callable(directory) and not known and not hosts:
        raise ValueError(NAMES_NOTHING.format(where="recipients_outside (no domains, no directory)"))
    names = _arg_names(arg)

    def outside(args: dict[str, Any], context: CallContext) -> bool:
        texts = _values(args, names, (str,))
        found = [a for text in texts or () for a in _addresses(text)]
        return not found or not all(a is not None and _address_inside(a, hosts, known) for a in found)

    return outside


def counterparty_unknown(
    known: Mapping[str, str] | Iterable[str], *, id_arg: str | None = None, name_arg: str | None = None
) -> ApprovalPredicate:
    """Ask unless the call's counterparty is a known one. `known` maps each counterparty's id to its name (or lists
    ids). The value of `id_arg` must be a known id, that of `name_arg` a known name (case and spacing aside), and
    when the call gives both they must name the same counterparty, so that "pay IBAN X, the landlord" cannot pass
    with the landlord's name and a stranger's account. At least one of them must be given."""
    if id_arg is None and name_arg is None:
        raise ValueError("counterparty_unknown needs id_arg, name_arg or both: the arguments that name the party")
    by_id = _known_counterparties(known, names=name_arg is not None)
    ids_of_name: dict[str, set[str]] = {}
    for ident, name in by_id.items():
        ids_of_name.setdefault(_name_key(name), set()).add(ident)

    def unknown(args: dict[str, Any], context: CallContext) -> bool:
        ident, name = _text(args, id_arg), _text(args, name_arg)
        if ident is None and name is None:
            return True
        candidates = set(by_id) if ident is None else {ident} & set(by_id)
        if name is not None:
            candidates &= ids_of_name.get(_name_key(name), set())
        return not candidates

    return unknown


def not_own(arg: str | Sequence[str] = "owner", *, owner_of: Callable[[Any], Any] | None = None) -> ApprovalPredicate:
    """Ask unless every resource in `arg` is the requester's own. Without `owner_of` the argument is the owner's id
    (`list_files(owner="ana")`); with it, the argument is a resource (or a list of them) and `owner_of(resource)`
    says whose it is, None when nobody's (a lookup without side effects: the gate asks it again before the call
    runs). The requester is `context.user_id`, who sent the request, never what the model says; none asks."""
    names = _arg_names(arg)

    def foreign(args: dict[str, Any], context: CallContext) -> bool:
        resources = _values(args, names, (str, int))
        if resources is None or context.user_id is None:
            return True
        return any((owner_of(r) if owner_of else r) != context.user_id for r in resources)

    return foreign


def any_of(*conditions: ApprovalPredicate) -> ApprovalPredicate:
    """Ask when any of `conditions` asks (one that raises makes the policy ask, as any predicate that raises)."""
    if not conditions or not all(callable(c) for c in conditions):
        raise ValueError("any_of needs one or more conditions, each a callable (args, context) -> bool")

    def any_asks(args: dict[str, Any], context: CallContext) -> bool:
        return any(condition(args, context) for condition in conditions)

    return any_asks


def ask_when(policy: ToolPolicy, condition: ApprovalPredicate) -> ToolPolicy:
    """`policy`, also asking a person when `condition` holds: "always" stays "always", "never" becomes the
    condition, a predicate asks when either does. Never weaker than `policy`, so it composes with
    `mcp_policies`: `ask_when(mcp_policies(tools, trusted=True)["fetch"], url_outside(["docs.example.com"]))`
    lets a trusted read-only fetch run alone inside the allowlist, and an untrusted server's tools stay gated."""
    if not callable(condition):
        raise ValueError("ask_when needs a condition: a callable (args, context) -> bool")
    current = policy.approval
    if current == "always":
        return policy
    approval = condition if current == "never" else any_of(cast(ApprovalPredicate, current), condition)
    return dataclasses.replace(policy, approval=approval)


def refuse_when(condition: ApprovalPredicate, reason: str) -> Validator:
    """A `validator` that refuses the call (`permission_denied`, `reason` shown to the model) when `condition`
    holds: the hard form of a condition, e.g. `validator=refuse_when(not_own("owner"), "only your own files")`.
    A condition that raises refuses the call too (the registry's rule for a validator that raises)."""
    if not callable(condition) or not isinstance(reason, str) or not reason.strip():
        raise ValueError("refuse_when needs a condition (a callable) and the reason the model is shown")

    def refuses(args: dict[str, Any], context: CallContext) -> str | None:
        if condition(args, context):
            raise ToolFailure(reason, error_type="permission_denied")
        return None

    return refuses


@dataclass(frozen=True)
class _Hosts:
    """Host entries: exact names or addresses, and the suffixes of `*.` entries (`.example.com`)."""

    exact: frozenset[str]
    suffixes: tuple[str, ...]

    def cover(self, host: str) -> bool:
        return host in self.exact or host.endswith(self.suffixes)

    def __bool__(self) -> bool:
        return bool(self.exact or self.suffixes)


@dataclass(frozen=True)
class _Prefix:
    """A URL prefix entry: scheme, host and port exactly, and the path at or below `path`."""

    scheme: str
    host: str
    port: int
    path: str

    def covers(self, scheme: str, host: str, port: int, path: str) -> bool:
        if (scheme, host, port) != (self.scheme, self.host, self.port) or _dot_segments(path):
            return False
        return not self.path or path == self.path or path.startswith(self.path + "/")


def _allowlist(
    entries: Iterable[str], where: str, *, urls: bool, empty_ok: bool = False
) -> tuple[_Hosts, tuple[_Prefix, ...]]:
    """The entries of an allowlist, each checked: a bad one raises `ValueError` naming it."""
    if isinstance(entries, str):
        raise ValueError(f"{where} must be a list of entries, not one string ({entries!r})")
    exact: set[str] = set()
    suffixes: list[str] = []
    prefixes: list[_Prefix] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ValueError(f"{where}: {entry!r} is not a string")
        if urls and "://" in entry:
            prefixes.append(_prefix_entry(entry, where))
        elif entry.startswith("*."):
            suffixes.append("." + _wildcard_entry(entry, where))
        else:
            exact.add(_host_entry(entry, where, urls))
    if not (exact or suffixes or prefixes or empty_ok):
        raise ValueError(NAMES_NOTHING.format(where=where))
    return _Hosts(frozenset(exact), tuple(suffixes)), tuple(prefixes)


def _host_entry(entry: str, where: str, urls: bool) -> str:
    host = _host(entry)
    if host is None or (not urls and _is_ip(host)):
        kinds = "a host name (example.com, *.example.com), an IP address or an http(s) URL" if urls else "a domain"
        raise ValueError(f"{where}: {entry!r} is not {kinds}")
    return host


def _wildcard_entry(entry: str, where: str) -> str:
    host = _host(entry[2:])
    if host is None or host.count(".") < 1 or _is_ip(host):
        raise ValueError(f"{where}: {entry!r} must be '*.' and a domain of two labels or more (*.example.com)")
    return host


def _prefix_entry(entry: str, where: str) -> _Prefix:
    parts = _url_parts(entry)
    split = urlsplit(entry)
    scheme = parts[0] if parts else None
    if parts is None or scheme is None or split.query or split.fragment or _dot_segments(split.path):
        raise ValueError(f"{where}: {entry!r} is not an http(s) URL prefix (scheme, host, optional port and path)")
    _, host, port, path = parts
    return _Prefix(scheme, host, port or DEFAULT_PORTS[scheme], path.rstrip("/"))


def _url_inside(url: str, hosts: _Hosts, prefixes: tuple[_Prefix, ...]) -> bool:
    parts = _url_parts(url)
    if parts is None:
        return False
    scheme, host, port, path = parts
    if hosts.cover(host):
        return True
    if scheme is None:
        return False
    return any(p.covers(scheme, host, port or DEFAULT_PORTS[scheme], path) for p in prefixes)


def _url_parts(url: str) -> tuple[str | None, str, int | None, str] | None:
    """(scheme or None when the text has none, host, port or None, path) of an http(s) URL; None for anything
    else, and for what parsers read differently (user info, backslashes, whitespace)."""
    if not url or "\\" in url or any(c.isspace() for c in url):
        return None
    head = re.split(r"[/?#]", url, maxsplit=1)[0]  # "https:" of "https://...", "example.com:8080" of a bare host
    scheme = head[:-1].lower() if head.endswith(":") else None
    if scheme is not None and (scheme not in DEFAULT_PORTS or not url[len(head) :].startswith("//")):
        return None
    if scheme is None and ":" in head and not head.rpartition(":")[2].isdigit():
        return None  # another scheme without "//" (mailto:, javascript:), or no host
    split = urlsplit(url if scheme else "//" + url)
    if "@" in split.netloc:
        return None
    try:
        port = split.port
    except ValueError:
        return None
    host = _host(split.hostname or "")
    return None if host is None else (scheme, host, port, split.path)


def _dot_segments(path: str) -> bool:
    return any(segment in (".", "..") for segment in unquote(path).split("/"))


def _host(text: str) -> str | None:
    """`text` as a canonical host: an IP address, or lower-case ASCII (IDNA) labels of letters, digits and inner
    hyphens (one trailing dot allowed); None for anything else."""
    if _is_ip(text):
        return str(ipaddress.ip_address(text))
    name = text[:-1] if text.endswith(".") else text
    try:
        name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return None
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        return None
    return name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _directory(entries: Iterable[str]) -> frozenset[str]:
    if isinstance(entries, str):
        raise ValueError(f"recipients_outside(directory) must be a list of addresses, not one string ({entries!r})")
    checked = set()
    for entry in entries:
        address = _address(entry) if isinstance(entry, str) else None
        if address is None:
            raise ValueError(f"recipients_outside(directory): {entry!r} is not an e-mail address (name@example.com)")
        checked.add(address)
    return frozenset(checked)


def _addresses(text: str) -> list[str | None]:
    """The addresses in `text` (comma-separated, each plain or `Name <address>`), None for a piece that is none."""
    pieces = [piece.strip() for piece in text.split(",") if piece.strip()]
    named = [_NAMED_ADDRESS.match(piece) for piece in pieces]
    return [_address(m.group(1) if m else piece) for piece, m in zip(pieces, named, strict=True)]


def _address(text: str) -> str | None:
    """`local@domain` with a valid domain, lower-cased; None for anything else."""
    local, at, domain = text.strip().rpartition("@")
    if not at or not local or "@" in local or any(c.isspace() or c in '<>,;"\\' for c in local):
        return None
    host = _host(domain)
    return None if host is None or _is_ip(host) else f"{local.lower()}@{host}"


def _address_inside(address: str, hosts: _Hosts, known: frozenset[str] | Callable[[str], bool]) -> bool:
    if hosts.cover(address.rpartition("@")[2]):
        return True
    return bool(known(address)) if callable(known) else address in known


def _known_counterparties(known: Mapping[str, str] | Iterable[str], *, names: bool) -> dict[str, str]:
    """`known` as id -> name, checked (ids: strings or integers; names: non-empty strings)."""
    if isinstance(known, str):
        raise ValueError(f"counterparty_unknown(known) must be a mapping or a list, not one string ({known!r})")
    if not isinstance(known, Mapping) and names:
        raise ValueError("counterparty_unknown(known) lists ids only: give a mapping id -> name to check name_arg")
    pairs = known.items() if isinstance(known, Mapping) else ((ident, str(ident)) for ident in known)
    checked: dict[str, str] = {}
    for ident, name in pairs:
        if isinstance(ident, bool) or not isinstance(ident, str | int) or not str(ident).strip():
            raise ValueError(f"counterparty_unknown(known): the id {ident!r} is not a non-empty string or an integer")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"counterparty_unknown(known): the name of {ident!r} is not a non-empty string")
        checked[str(ident)] = name
    if not checked:
        raise ValueError(NAMES_NOTHING.format(where="counterparty_unknown(known)"))
    return checked


def _name_key(name: str) -> str:
    return " ".join(name.split()).casefold()


def _arg_names(arg: str | Sequence[str]) -> tuple[str, ...]:
    names = (arg,) if isinstance(arg, str) else tuple(arg)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"the argument names must be one or more non-empty strings, not {arg!r}")
    return names


def _text(args: dict[str, Any], name: str | None) -> str | None:
    """One argument's value as text (a string or an integer), None when absent. Any other value reads as "", which
    no known id or name is (both are checked non-empty), so the call asks."""
    value = None if name is None else args.get(name)
    if value is None:
        return None
    return str(value) if _of_kind(value, (str, int)) else ""


def _values(args: dict[str, Any], names: tuple[str, ...], kinds: tuple[type, ...]) -> list[Any] | None:
    """Every value of the named arguments, a list flattened; None when there is none, or one is not of `kinds`,
    so the caller asks."""
    found: list[Any] = []
    for name in names:
        value = args.get(name)
        items = value if isinstance(value, list | tuple) else [] if value is None else [value]
        if not all(_of_kind(item, kinds) for item in items):
            return None
        found += items
    return found or None


def _of_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool)
