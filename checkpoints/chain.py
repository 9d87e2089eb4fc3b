"""The evidence chain: every evidence and audit row gatedloop writes, hash-chained in the order it was committed.

The evidence tables (`gatedloop_calls`, `gatedloop_approvals`, the audit trail, the execution ledger...) keep
their stored format. Beside them, `gatedloop_chain` holds one entry per row written (inserted, or updated: a claim
that finishes, a call that is answered): the row's table and key, the hash of its canonical content, the hash of
the entry before it, and its own chain hash over all of that. It is appended in the transaction that writes the
row, so a row and its entry commit together or not at all. An entry's signature (Ed25519, when a key is
configured) covers its chain hash, and so every entry before it: the head is signed in each transaction that
records a decision (an approval, an edit, a rejection, a refusal, a settlement of an unknown outcome, an upgrade)
and on demand (`gatedloop audit sign`).

Order is the database's commit order, kept by one writer at a time at the chain's head:

- SQLite: every ledger write is a `BEGIN IMMEDIATE` transaction, which holds the database's write lock from its
  first statement to its commit, so reading the head and appending after it cannot interleave with another
  writer (thread or process).
- Postgres: a transaction-level advisory lock (`pg_advisory_xact_lock(CHAIN_LOCK_KEY)`) is taken after the
  transaction's own evidence statements and before the head is read; it is released at commit, so the next
  appender, whose head read is a new statement under READ COMMITTED, sees the entries just committed. Writers
  serialize only for the few statements between the lock and the commit. The lock and the head read are one
  round trip, `gatedloop_chain_head_locked()`: a PL/pgSQL function, because each statement inside a volatile
  function takes a new snapshot, so its head read sees what committed while it waited for the lock (one plain
  statement would read with the snapshot it took before waiting).

The chain begins where this code first wrote to a ledger: its first entry (`seq` 1, table `genesis`) records how
many rows each evidence table held before, so an old database opens, resumes and gains a chain from its first
new row; `verify` says where the chain begins and flags rows written since without an entry. Those earlier rows
are excused from every check, so with a key the genesis is signed when it is written, and `verify` with a key
refuses an unsigned one that excuses rows: anyone with write access could otherwise edit any row, delete the
chain and write a genesis that counts every row as earlier.

What a hash chain proves and what it does not is in docs/evidence.md: without a key, anyone with write access
can recompute every hash after an edit; a signature needs the private key; deleting the newest rows deletes
their signatures too, and a key holder can re-sign a rewritten history, so the signed heads are worth publishing
outside the database (checkpoints/witness.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from gatedloop.checkpoints.pruning import Statements

T = TypeVar("T")

CHAIN_SCHEMA = """
CREATE TABLE IF NOT EXISTS gatedloop_chain (
    seq BIGINT PRIMARY KEY,
    row_table TEXT NOT NULL,
    row_key TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    chain_hash TEXT NOT NULL,
    at REAL NOT NULL,
    signature TEXT
);
"""

CHAIN_LOCK_KEY = int.from_bytes(hashlib.sha256(b"gatedloop:chain").digest()[:8], "big", signed=True)
POSTGRES_CHAIN_LOCK = f"SELECT pg_advisory_xact_lock({CHAIN_LOCK_KEY})"
POSTGRES_LOCKED_HEAD_FUNCTION = f"""
CREATE OR REPLACE FUNCTION gatedloop_chain_head_locked() RETURNS TABLE (seq BIGINT, chain_hash TEXT)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY});
    RETURN QUERY SELECT c.seq, c.chain_hash FROM gatedloop_chain c ORDER BY c.seq DESC LIMIT 1;
END $$
"""
"""Postgres: the chain's lock, then its head, in one round trip (see the module's docstring for why a function)."""
POSTGRES_LOCKED_HEAD_QUERY = "SELECT seq, chain_hash FROM gatedloop_chain_head_locked()"
GENESIS_TABLE = "genesis"
ZERO_HASH = "0" * 64
SIGNATURE_DOMAIN = b"gatedloop-chain-head-v1\n"
KEY_ENV = "GATEDLOOP_SIGNING_KEY"
PUBLIC_KEY_ENV = "GATEDLOOP_PUBLIC_KEY"


@dataclass(frozen=True)
class ChainedTable:
    """An evidence table whose rows are chained: every column (in the order a RETURNING clause gives them), the
    columns that name a row, the columns whose values a receipt shows only as a hash, and the columns `added` to
    the table after rows of it were chained, each with the value the rows before it hold (its default).

    An added column is hashed only when its value is not that default: a row chained before the column existed
    keeps its content hash (a chain, an export or a receipt written then still verifies), and a row chained since
    is covered all the same, since a row read without the column and one whose column holds the default are the
    same fact (`gatedloop_approvals.sent_back_round`: 0 is "never sent back before", which every earlier row was).
    The alternative, a new hash version for rows written since, would need every checker to know which rows are
    which, for no more coverage."""

    columns: tuple[str, ...]
    key: tuple[str, ...]
    withheld: tuple[str, ...] = ()
    added: Mapping[str, Any] = field(default_factory=dict)


CHAINED: dict[str, ChainedTable] = {
    "gatedloop_ledger": ChainedTable(
        (
            "thread_id",
            "call_id",
            "tool",
            "args_digest",
            "idempotency_key",
            "state",
            "result",
            "claimed_at",
            "finished_at",
            "attempts",
            "claimant",
        ),
        ("thread_id", "call_id"),
        ("result",),
    ),
    "gatedloop_audit": ChainedTable(("seq", "thread_id", "call_id", "event", "actor", "at", "detail"), ("seq",)),
    "gatedloop_calls": ChainedTable(
        (
            "thread_id",
            "call_id",
            "tool",
            "args_digest",
            "verdict",
            "requester",
            "requested_at",
            "answer_digest",
            "answer_source",
            "answered_at",
        ),
        ("thread_id", "call_id"),
    ),
    "gatedloop_proposals": ChainedTable(
        ("thread_id", "call_id", "tool", "args_digest", "proposed_at"), ("thread_id", "call_id")
    ),
    "gatedloop_approvals": ChainedTable(
        (
            "seq",
            "thread_id",
            "call_id",
            "tool",
            "args_digest",
            "reviewer",
            "roles",
            "decision",
            "at",
            "sent_back_round",
        ),
        ("seq",),
        added={"sent_back_round": 0},
    ),
    "gatedloop_tool_pins": ChainedTable(("thread_id", "call_id", "tool_digest"), ("thread_id", "call_id")),
    "gatedloop_thread_graphs": ChainedTable(("thread_id", "graph_name", "graph_digest", "recorded_at"), ("thread_id",)),
    "gatedloop_thread_policies": ChainedTable(
        ("thread_id", "policy_digest", "policies", "recorded_at"), ("thread_id",)
    ),
    "gatedloop_edited_args": ChainedTable(("seq", "thread_id", "call_id", "args_digest", "args"), ("seq",), ("args",)),
    "gatedloop_grants": ChainedTable(
        (
            "grant_id",
            "tool",
            "bounds",
            "requester",
            "uses",
            "uses_taken",
            "expires_at",
            "note",
            "granted_by",
            "created_at",
            "revoked_at",
            "revoked_by",
        ),
        ("grant_id",),
    ),
    "gatedloop_grant_confirmations": ChainedTable(("grant_id", "granter", "roles", "at"), ("grant_id", "granter")),
    "gatedloop_grant_uses": ChainedTable(
        ("thread_id", "call_id", "grant_id", "args_digest", "at"), ("thread_id", "call_id")
    ),
    "gatedloop_limit_usage": ChainedTable(
        ("tool", "limit_key", "group_key", "window_start", "window_s", "total", "calls", "at_most"),
        ("tool", "limit_key", "group_key", "window_start"),
    ),
}
"""Every evidence and audit table (the cancel flags and the notification outbox are not evidence)."""

DECISION_EVENTS = (
    "decision",
    "refused",
    "answer_refused",
    "unknown_outcome_decision",
    "unknown_answer_refused",
    "graph_upgraded",
    "grant_created",
    "grant_confirmed",
    "grant_revoked",
    "grant_used",
)
"""Audit events (by name, or name before a `:`) after which the head is signed."""

_WRITE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE)\s+(gatedloop_\w+)", re.IGNORECASE)


def chained_table(query: str) -> str | None:
    """The chained table a write statement changes (None: not an evidence write)."""
    match = _WRITE.match(query)
    return match.group(1) if match and match.group(1) in CHAINED else None


def returning(table: str) -> str:
    return " RETURNING " + ", ".join(CHAINED[table].columns)


def canonical(value: Any) -> str:
    """The one text a value hashes as: sorted keys, no spaces, floats as Python's shortest round-trip form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def row_values(row: Any) -> tuple[Any, ...]:
    """A fetched row as a tuple (psycopg's dict rows keep the RETURNING order)."""
    return tuple(row.values()) if isinstance(row, Mapping) else tuple(row)


REAL_COLUMNS = frozenset(
    (
        "claimed_at",
        "finished_at",
        "at",
        "requested_at",
        "answered_at",
        "proposed_at",
        "recorded_at",
        "expires_at",
        "created_at",
        "revoked_at",
        "window_start",
        "window_s",
        "total",
        "at_most",
    )
)
"""Columns declared REAL: SQLite's RETURNING gives a value before the column's affinity applies (an int stays an
int), a later SELECT gives it after (a float), so both are read as floats."""


def as_row(table: str, values: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(CHAINED[table].columns, values, strict=True))
    for column in REAL_COLUMNS.intersection(row):
        if row[column] is not None:
            row[column] = float(row[column])
    return row


_KEY_TEXT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def row_key(table: str, row: Mapping[str, Any]) -> str:
    """The columns that name a row, as a JSON list (its canonical form: no sort, no spaces)."""
    return _KEY_TEXT([row[column] for column in CHAINED[table].key])


def value_text(value: Any) -> str:
    """A column value as the text it is hashed as, tagged by type (the types the evidence tables hold)."""
    if isinstance(value, str):
        return "s" + value
    if value is None:
        return "n"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"i{value}"
    raise TypeError(f"no evidence column holds a {type(value).__name__}")


def withheld_hash(value: Any) -> str:
    """What a receipt shows of a withheld column (a tool's result, a secret edit): the hash of its value."""
    return sha256(value_text(value))


def content_hash_of(table: str, values: Mapping[str, Any], withheld: Mapping[str, str]) -> str:
    """A row's content hash: its table, then each column in name order as `name=length:text`, where text is the
    value's (`value_text`) or, for a column the table withholds from receipts, `h` and the value's hash. So a
    receipt checks a row whose result it shows only as a hash, with one SHA-256 per row. A column added to the
    table later counts only when it is not at its default (`ChainedTable.added`)."""
    added = CHAINED[table].added
    values = {k: v for k, v in values.items() if k not in added or v != added[k]}
    parts = [table]
    for column in sorted((*values, *withheld)):
        text = "h" + withheld[column] if column in withheld else value_text(values[column])
        parts.append(f"{column}={len(text)}:{text}")
    return sha256("\n".join(parts))


def content_hash(table: str, row: Mapping[str, Any]) -> str:
    hidden = CHAINED[table].withheld
    if not hidden:
        return content_hash_of(table, row, {})
    values = {k: v for k, v in row.items() if k not in hidden}
    return content_hash_of(table, values, {k: withheld_hash(row[k]) for k in hidden})


def chain_hash(seq: int, table: str, key: str, content: str, prev: str, at: float) -> str:
    return sha256("\n".join(["gatedloop-chain-v1", str(seq), table, key, content, prev, repr(float(at))]))


@dataclass(frozen=True)
class SignedHead:
    """A chain head as signed: what a witness publishes outside the database (`at`: when it was signed)."""

    seq: int
    chain_hash: str
    signature: str
    at: float

    @property
    def key_id(self) -> str:
        return self.signature.partition(":")[0]


@dataclass(frozen=True)
class Appended:
    """What one transaction did to the chain: rows chained, the head's seq after it, and the head it signed (to be
    published only once the transaction has committed: a rolled-back head was never the chain's)."""

    written: int
    head: int
    signed: SignedHead | None = None


def is_decision(table: str, row: Mapping[str, Any]) -> bool:
    if table == "gatedloop_approvals":
        return True
    return table == "gatedloop_audit" and str(row["event"]).split(":", 1)[0] in DECISION_EVENTS


# --- keys and signatures --------------------------------------------------------------------------------------


class Signer:
    """An Ed25519 private key that signs chain heads. The signature text is `key-id:base64`, the key id the first
    16 hex digits of the SHA-256 of the raw public key, so a verifier says which key a head was signed with."""

    def __init__(self, private_key: Any):
        self._key = private_key
        self.verifier = Verifier(private_key.public_key())

    @classmethod
    def generate(cls) -> Signer:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> Signer:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        key = load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the signing key must be an Ed25519 private key (PEM, PKCS#8)")
        return cls(key)

    @property
    def key_id(self) -> str:
        return self.verifier.key_id

    def private_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return bytes(
            self._key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def sign_head(self, seq: int, head_hash: str) -> str:
        raw = self._key.sign(SIGNATURE_DOMAIN + f"{seq}\n{head_hash}".encode())
        return f"{self.key_id}:{base64.b64encode(raw).decode()}"


class Verifier:
    """An Ed25519 public key that checks chain-head signatures."""

    def __init__(self, public_key: Any):
        from cryptography.hazmat.primitives import serialization

        self._key = public_key
        raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = hashlib.sha256(raw).hexdigest()[:16]

    @classmethod
    def from_pem(cls, pem: bytes) -> Verifier:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        key = load_pem_public_key(pem)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the public key must be an Ed25519 public key (PEM)")
        return cls(key)

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return bytes(
            self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    def check(self, seq: int, head_hash: str, signature: str) -> str | None:
        """None if `signature` is this key's over (seq, head); else what is wrong."""
        from cryptography.exceptions import InvalidSignature

        key_id, _, text = signature.partition(":")
        if key_id != self.key_id:
            return f"signed with key {key_id or '?'}, not {self.key_id}"
        try:
            raw = base64.b64decode(text, validate=True)
            if base64.b64encode(raw).decode() != text:  # the unused bits of the last character: one text per signature
                raise ValueError("not canonical base64")
            self._key.verify(raw, SIGNATURE_DOMAIN + f"{seq}\n{head_hash}".encode())
        except (InvalidSignature, ValueError):
            return "its signature does not verify"
        return None


def _pem_or_path(value: str) -> bytes:
    text = value.strip()
    return text.encode() if text.startswith("-----BEGIN") else Path(text).expanduser().read_bytes()


def signer_from_env(environ: Mapping[str, str] | None = None) -> Signer | None:
    """The signing key of `GATEDLOOP_SIGNING_KEY` (PEM text, or the path of a PEM file); None when unset."""
    value = (os.environ if environ is None else environ).get(KEY_ENV, "")
    return Signer.from_pem(_pem_or_path(value)) if value.strip() else None


def load_verifier(value: str) -> Verifier:
    """A public key from PEM text or a file path (a private key file gives its public half)."""
    pem = _pem_or_path(value)
    if b"PRIVATE KEY" in pem:
        return Signer.from_pem(pem).verifier
    return Verifier.from_pem(pem)


def write_key_pair(directory: str | Path) -> tuple[Path, Path, Signer]:
    """`gatedloop keys init`: signing.key (mode 0600, created exclusively) and signing.pub in `directory`."""
    target = Path(directory).expanduser()
    target.mkdir(parents=True, exist_ok=True)
    private, public = target / "signing.key", target / "signing.pub"
    if private.exists():
        raise FileExistsError(f"{private} exists; move it away first (a new key cannot verify older heads)")
    signer = Signer.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(signer.private_pem())
    os.chmod(private, 0o600)
    public.write_bytes(signer.verifier.public_pem())
    return private, public, signer


# --- appending, as statements any backend runs in its own transaction ----------------------------------------

INSERT_ROWS = 500
"""Entries per INSERT statement: well under SQLite's 32766 and Postgres's 65535 bound parameters."""
HEAD_QUERY = "SELECT seq, chain_hash FROM gatedloop_chain ORDER BY seq DESC LIMIT 1"


def _insert(p: str, rows: int = 1) -> str:
    values = ", ".join([f"({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"] * rows)
    return (
        "INSERT INTO gatedloop_chain (seq, row_table, row_key, content_hash, prev_hash, chain_hash, at, signature)"
        f" VALUES {values}"
    )


def drive(execute: Callable[[str, Sequence[Any], bool], list[Any]], statements: Statements[T]) -> T:
    """Run a statements generator on one transaction's `execute(query, params, fetch) -> rows`."""
    try:
        query, params, fetch = next(statements)
        while True:
            query, params, fetch = statements.send(execute(query, params, fetch))
    except StopIteration as done:
        return cast(T, done.value)


def begin_chain(placeholder: str, postgres: bool, signer: Signer | None = None) -> Statements[None]:
    """The genesis entry, if the chain has none yet: how many rows each evidence table held before it began,
    signed when a key is configured (it excuses those rows from every check: see `genesis_problem`)."""
    lock = POSTGRES_CHAIN_LOCK if postgres else None
    if (yield ("SELECT 1 FROM gatedloop_chain LIMIT 1", (), True)):
        return
    if lock:
        yield lock, (), False
        if (yield ("SELECT 1 FROM gatedloop_chain LIMIT 1", (), True)):
            return
    before: dict[str, dict[str, int]] = {}
    for table, spec in CHAINED.items():
        top = "MAX(seq)" if "seq" in spec.columns else "0"
        rows = yield (f"SELECT COUNT(*), {top} FROM {table}", (), True)
        count, last = row_values(rows[0])
        before[table] = {"rows": int(count or 0), "max_seq": int(last or 0)}
    key = canonical({"version": 1, "before": before})
    at = time.time()
    content = sha256(key)
    genesis = chain_hash(1, GENESIS_TABLE, key, content, ZERO_HASH, at)
    signature = signer.sign_head(1, genesis) if signer else None
    yield _insert(placeholder), (1, GENESIS_TABLE, key, content, ZERO_HASH, genesis, at, signature), False


def append(
    placeholder: str,
    postgres: bool,
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    signer: Signer | None,
    *,
    sign: bool = False,
) -> Statements[Appended]:
    """Chain `entries` ((table, row as written)) after the head, signing the new head if `sign` (or if any entry
    is a decision) and a key is configured. Run after the rows' own statements."""
    sign = sign or any(is_decision(table, row) for table, row in entries)
    if not entries and not (sign and signer):
        return Appended(0, 0)
    head = yield (POSTGRES_LOCKED_HEAD_QUERY if postgres else HEAD_QUERY, (), True)
    seq, prev = (int(row_values(head[0])[0]), str(row_values(head[0])[1])) if head else (0, ZERO_HASH)
    at = time.time()
    if not entries:  # a signature on demand, on the head as it stands
        if not seq:
            return Appended(0, 0)
        signature = signer.sign_head(seq, prev) if signer else None
        yield (
            "UPDATE gatedloop_chain SET signature=? WHERE seq=?".replace("?", placeholder),
            (signature, seq),
            False,
        )
        return Appended(0, seq, SignedHead(seq, prev, signature, at) if signature else None)
    params: list[Any] = []
    signature = None
    for index, (table, row) in enumerate(entries):
        seq += 1
        key, content = row_key(table, row), content_hash(table, row)
        current = chain_hash(seq, table, key, content, prev, at)
        signature = signer.sign_head(seq, current) if signer and sign and index == len(entries) - 1 else None
        params += (seq, table, key, content, prev, current, at, signature)
        prev = current
    width = 8 * INSERT_ROWS  # one statement per INSERT_ROWS entries (a copied thread can have thousands)
    for start in range(0, len(params), width):
        part = params[start : start + width]
        yield _insert(placeholder, len(part) // 8), part, False
    return Appended(len(entries), seq, SignedHead(seq, prev, signature, at) if signature else None)


def chained_statements(
    placeholder: str,
    postgres: bool,
    statements: Iterable[tuple[str, Sequence[Any]]],
    signer: Signer | None,
    *,
    started: bool,
) -> Statements[Appended]:
    """Run `statements` in the caller's transaction and chain every evidence row they wrote (an evidence write
    gets a RETURNING clause, so the row is hashed as stored); `written` is how many evidence rows were written."""

    def each() -> Statements[None]:
        for query, params in statements:
            yield query, params, False

    _, appended = yield from chaining(placeholder, postgres, each(), signer, started=started)
    return appended


def chaining(
    placeholder: str, postgres: bool, body: Statements[T], signer: Signer | None, *, started: bool
) -> Statements[tuple[T, Appended]]:
    """Run `body` in the caller's transaction, chaining every evidence row its writes return, and what it returned.

    For a transaction whose next statement depends on what the last one wrote (a claim that takes a grant's use
    and charges limits only if the claim is new): each evidence write gets a RETURNING clause and `body` receives
    its rows (the rows written; none where a conflict or a condition stopped it). `body` raising rolls everything
    back, chain entries included."""
    if not started:
        yield from begin_chain(placeholder, postgres, signer)
    entries: list[tuple[str, dict[str, Any]]] = []
    try:
        query, params, fetch = next(body)
        while True:
            table = chained_table(query)
            if table is None:
                rows = yield query, params, fetch
            else:
                rows = yield query + returning(table), params, True
                entries.extend((table, as_row(table, row_values(row))) for row in rows)
            query, params, fetch = body.send(rows)
    except StopIteration as done:
        result = cast(T, done.value)
    return result, (yield from append(placeholder, postgres, entries, signer))


# --- verification --------------------------------------------------------------------------------------------


ENTRY_FIELDS = frozenset(("seq", "table", "key", "content_hash", "prev_hash", "chain_hash", "at", "signature"))


@dataclass(frozen=True)
class ChainEntry:
    seq: int
    table: str
    key: str
    content_hash: str
    prev_hash: str
    chain_hash: str
    at: float
    signature: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "table": self.table,
            "key": self.key,
            "content_hash": self.content_hash,
            "prev_hash": self.prev_hash,
            "chain_hash": self.chain_hash,
            "at": self.at,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ChainEntry:
        if set(body) != ENTRY_FIELDS:
            raise ValueError(f"a chain entry has the fields {sorted(ENTRY_FIELDS)}")
        return cls(
            int(body["seq"]),
            str(body["table"]),
            str(body["key"]),
            str(body["content_hash"]),
            str(body["prev_hash"]),
            str(body["chain_hash"]),
            float(body["at"]),
            None if body.get("signature") is None else str(body["signature"]),
        )

    def where(self) -> str:
        if self.table == GENESIS_TABLE:  # its key is the counts of earlier rows: long, and named by the word
            return f"chain row {self.seq} (genesis)"
        return f"chain row {self.seq} ({self.table} {self.key})"


UNPLACED = 1 << 62  # a problem with no chain position (a row missing from the chain) sorts after placed ones
CHAIN_COLUMNS = "seq, row_table, row_key, content_hash, prev_hash, chain_hash, at, signature"


@dataclass
class Report:
    """What `verify` found: `problems` in chain order, the first one first."""

    entries: int = 0
    head: tuple[int, str] | None = None
    """The last entry's position and chain hash: worth publishing outside the database."""
    begins: str = ""
    signed_up_to: int = 0
    signatures: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_bad(self) -> str | None:
        return self.problems[0] if self.problems else None


def check_links(
    entries: Sequence[ChainEntry], verifier: Verifier | None, report: Report, *, first: int = 1
) -> int | None:
    """Sequence, links, hashes and signatures of consecutive entries, the first at seq `first`; the seq of the
    first entry that does not hold (its reason in `report.problems`), or None."""
    expected_seq, prev = first, entries[0].prev_hash if entries and first != 1 else ZERO_HASH
    for entry in entries:
        if entry.seq != expected_seq:
            report.problems.append(f"{entry.where()}: expected chain row {expected_seq} here (a row is missing)")
            return entry.seq
        if entry.prev_hash != prev:
            report.problems.append(f"{entry.where()}: its previous hash is not the hash of chain row {entry.seq - 1}")
            return entry.seq
        recomputed = chain_hash(entry.seq, entry.table, entry.key, entry.content_hash, entry.prev_hash, entry.at)
        if recomputed != entry.chain_hash:
            report.problems.append(f"{entry.where()}: its chain hash does not match its content")
            return entry.seq
        if entry.signature is not None:
            report.signatures += 1
            if verifier is not None:
                wrong = verifier.check(entry.seq, entry.chain_hash, entry.signature)
                if wrong:
                    report.problems.append(f"{entry.where()}: {wrong}")
                    return entry.seq
                report.signed_up_to = entry.seq
        expected_seq, prev = expected_seq + 1, entry.chain_hash
    return None


ALLOW_UNSIGNED_GENESIS = "--allow-unsigned-genesis"


def genesis_problem(genesis: ChainEntry, earlier: int, verifier: Verifier | None, allow_unsigned: bool) -> str | None:
    """What is wrong with an unsigned genesis that counts `earlier` rows as before the chain (None: nothing).

    Those rows are excused from every check, so anyone with write access could edit any row, delete the chain and
    write an unsigned genesis that counts every row as earlier. With a key, a genesis that excuses rows must be
    signed (one that excuses none gives no one anything: every row is then chained). A chain begun by an older
    gatedloop has an unsigned genesis; an auditor who knows that accepts its earlier rows unchecked, explicitly
    (`allow_unsigned`), rather than have `verify` pass in silence."""
    if genesis.signature is not None or verifier is None or not earlier or allow_unsigned:
        return None
    return (
        f"{genesis.where()}: unsigned, yet it counts {earlier} earlier rows as before the chain, so unchecked; with a"
        f" key the genesis that excuses rows must be signed (a chain begun by an older gatedloop is not: if this"
        f" is one, {ALLOW_UNSIGNED_GENESIS} accepts those rows unchecked)"
    )


def genesis_note(genesis: ChainEntry, earlier: int, verifier: Verifier | None) -> str | None:
    """What `verify` says of an unsigned genesis it accepts (None for a signed one)."""
    if genesis.signature is not None:
        return None
    if not earlier:
        return "the genesis (chain row 1) is unsigned; it excuses no rows"
    if verifier is None:
        return f"the genesis (chain row 1) is unsigned: the {earlier} earlier rows it excuses rest on it alone"
    accepted = f"its {earlier} earlier rows accepted unchecked ({ALLOW_UNSIGNED_GENESIS})"
    return f"the genesis (chain row 1) is unsigned: {accepted}"


def verify_chain(
    entries: Sequence[ChainEntry],
    current_rows: Callable[[str], Iterable[dict[str, Any]]],
    verifier: Verifier | None,
    *,
    allow_unsigned_genesis: bool = False,
) -> Report:
    """Check a whole ledger's chain against the rows as they are now (`current_rows(table)`: every row of a
    chained table): links, hashes and signatures; every row's latest entry matches the row (edited, swapped or
    deleted rows do not); no row written since the chain began lacks an entry (an inserted row does); with a key,
    every decision is covered by a valid signature at or after it, and a genesis that excuses rows is signed
    (`genesis_problem`)."""
    report = Report(entries=len(entries))
    if not entries:
        if verifier is not None:  # an auditor who expects signatures: a missing chain is not a clean one
            report.problems.append(f"no chain: nothing here is signed by key {verifier.key_id}")
        else:
            report.notes.append("no chain yet: nothing was written since evidence chaining began")
        return report
    report.head = (entries[-1].seq, entries[-1].chain_hash)
    genesis = entries[0]
    if genesis.table != GENESIS_TABLE or genesis.seq != 1:
        report.problems.append(f"{genesis.where()}: the chain does not start with its genesis row")
        return report
    before = json.loads(genesis.key).get("before", {})
    earlier = sum(v["rows"] for v in before.values())
    report.begins = f"chain row 1, at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(genesis.at))}" + (
        f", after {earlier} earlier rows (not in it: not verified)" if before else ""
    )
    problems: list[tuple[int, str]] = []
    refused = genesis_problem(genesis, earlier, verifier, allow_unsigned_genesis)
    if refused:
        problems.append((genesis.seq, refused))
    elif note := genesis_note(genesis, earlier, verifier):
        report.notes.append(note)
    links = Report()
    broken = check_links(entries, verifier, links)
    decisions: list[int] = []
    latest: dict[tuple[str, str], ChainEntry] = {}
    for entry in entries[1:]:
        latest[(entry.table, entry.key)] = entry
    for table, spec in CHAINED.items():
        unchained: list[tuple[dict[str, Any], str]] = []
        for row in current_rows(table):
            key = row_key(table, row)
            found = latest.pop((table, key), None)
            if found is None:
                unchained.append((row, key))
            elif content_hash(table, row) != found.content_hash:
                problems.append((found.seq, f"{found.where()}: the row no longer matches its chained content (edited)"))
            elif is_decision(table, row):
                decisions.append(found.seq)
        earlier = before.get(table, {"rows": 0, "max_seq": 0})
        if "seq" in spec.columns:
            for row, key in unchained:
                if int(row["seq"]) > earlier["max_seq"]:
                    problems.append((UNPLACED, f"{table} {key}: written after the chain began, not in it (inserted)"))
        if len(unchained) > earlier["rows"]:
            keys = ", ".join(key for _, key in unchained[earlier["rows"] :][:3])
            problems.append(
                (
                    UNPLACED,
                    f"{table}: {len(unchained)} rows not in the chain, {earlier['rows']} before it began ({keys})",
                )
            )
    for entry in latest.values():
        problems.append((entry.seq, f"{entry.where()}: the row is gone (deleted, or its key edited)"))
    if broken is not None:
        problems.append((broken, links.problems[0]))
    report.signatures, report.signed_up_to = links.signatures, links.signed_up_to
    if verifier is not None and not links.problems:
        unsigned = [seq for seq in decisions if seq > links.signed_up_to]
        if unsigned:
            entry = entries[min(unsigned) - 1]
            problems.append((entry.seq, f"{entry.where()}: a decision no valid signature covers"))
        if links.signed_up_to < entries[-1].seq:
            report.notes.append(
                f"chain rows {links.signed_up_to + 1}..{entries[-1].seq} are after the last signed head"
                " (hash-checked only; `gatedloop audit sign` signs the head)"
            )
    elif verifier is None and links.signatures:
        report.notes.append(f"{links.signatures} signed heads not checked (no public key given)")
    report.problems = [text for _, text in sorted(problems, key=lambda item: item[0])]
    return report
