"""The witness: signed chain heads kept outside the database, so that a chain cut short is found.

Deleting the newest evidence rows with their chain entries leaves a shorter chain that verifies: the signatures
that covered those rows go with them, and nothing left in the database says the chain was ever longer. A witness
remembers it: a file of JSON lines, only ever appended to, one per signed head (`seq`, `chain_hash`, `signature`,
`key_id`, `at`), kept where write access to the database does not reach (another host, a write-once bucket, a log
shipper's input). Every head signed with `GATEDLOOP_AUDIT_WITNESS` set is appended (each decision's, `audit sign`,
`audit export`), once its transaction has committed: a head rolled back was never the chain's. `gatedloop audit
sign --witness FILE` appends the head it signs. `gatedloop audit verify --witness FILE` fails when the chain ends
before the newest witnessed head, or differs from a witnessed head at its position.

A line is one `write()` on a descriptor opened with `O_APPEND` (the kernel puts each write at the end of the file
as one piece, so lines from several processes never interleave), fsynced before the call returns. Its signature
is the chain's own (Ed25519 over the head's position and hash), so a public key checks a line without the database;
`at` (when it was signed) is not signed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gatedloop.checkpoints.chain import SignedHead, Verifier, canonical

WITNESS_ENV = "GATEDLOOP_AUDIT_WITNESS"
LINE_FIELDS = frozenset(("seq", "chain_hash", "signature", "key_id", "at"))

log = logging.getLogger("gatedloop.witness")


def witness_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The witness file of `GATEDLOOP_AUDIT_WITNESS`; None when unset."""
    value = (os.environ if environ is None else environ).get(WITNESS_ENV, "").strip()
    return value or None


def head_line(head: SignedHead) -> str:
    body = {"seq": head.seq, "chain_hash": head.chain_hash, "signature": head.signature, "key_id": head.key_id}
    return canonical({**body, "at": head.at}) + "\n"


def append_head(path: str | Path, head: SignedHead) -> None:
    """Append one head to the witness, durably (OSError if it cannot be written)."""
    data = head_line(head).encode()
    fd = os.open(Path(path).expanduser(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"a short write to the witness {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(path: str | None, head: SignedHead | None) -> None:
    """A ledger's, after a commit that signed a head. A witness that cannot be written is logged, not raised: the
    decision is committed and stands, and failing the run would not bring the line back; the next signed head
    covers this one."""
    if path is None or head is None:
        return
    try:
        append_head(path, head)
    except OSError as exc:
        log.warning("chain row %d was signed but not appended to the witness %s: %s", head.seq, path, exc)


def parse_line(text: str) -> SignedHead:
    body = json.loads(text)
    if not isinstance(body, dict) or set(body) != LINE_FIELDS:
        raise ValueError(f"a witness line has the fields {sorted(LINE_FIELDS)}")
    if not isinstance(body["seq"], int) or not all(isinstance(body[k], str) for k in ("chain_hash", "signature")):
        raise ValueError("seq is a number, chain_hash and signature are texts")
    head = SignedHead(body["seq"], body["chain_hash"], body["signature"], float(body["at"]))
    if head.key_id != body["key_id"]:
        raise ValueError("its key_id is not its signature's")
    return head


@dataclass
class WitnessCheck:
    """What `check_witness` found: the witnessed heads it read, the newest, and what does not hold."""

    heads: int = 0
    newest: SignedHead | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def reached(self) -> str:
        """The verify summary's words for a witness that holds."""
        if self.newest is None:
            return "; the witness holds no heads"
        return f"; reaches the witnessed head chain row {self.newest.seq} ({self.heads} witness lines)"


def _named(head: SignedHead, number: int) -> str:
    signed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(head.at))
    return f"witnessed head chain row {head.seq} ({head.chain_hash[:16]}..., witness line {number}, signed {signed})"


def read_heads(lines: Iterable[str], verifier: Verifier | None, found: WitnessCheck) -> list[tuple[int, SignedHead]]:
    """(line number, head) of every line that is a signed head, by `verifier` when given; the others are problems:
    a line someone appended without the key is not evidence of anything."""
    heads = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            head = parse_line(text)
        except (ValueError, TypeError) as exc:
            found.problems.append(f"witness line {number}: not a signed head ({exc})")
            continue
        wrong = verifier.check(head.seq, head.chain_hash, head.signature) if verifier else None
        if wrong:
            found.problems.append(f"witness line {number} (chain row {head.seq}): {wrong}")
            continue
        heads.append((number, head))
    return heads


def check_witness(
    lines: Iterable[str], chain: Mapping[int, str], verifier: Verifier | None, *, whole: bool
) -> WitnessCheck:
    """Check the chain at hand (`chain`: seq -> chain hash) against a witness's lines: every witnessed head it holds
    has the witnessed hash (a chain rewritten, or cut and grown again, does not), and it reaches the newest
    witnessed head (a chain cut short does not). `whole`: the chain is a live ledger's, every row of it; an
    export carries only its receipts' segments, so a witnessed head between them is noted, not checked."""
    found = WitnessCheck()
    heads = read_heads(lines, verifier, found)
    if verifier is None and heads:
        found.notes.append("witness lines' signatures not checked (no public key given)")
    if not heads:
        return found
    found.heads = len(heads)
    number, found.newest = max(heads, key=lambda item: item[1].seq)
    last = max(chain, default=0)
    for at_line, head in sorted(heads, key=lambda item: item[1].seq):
        held = chain.get(head.seq)
        if head.seq <= last and held != head.chain_hash and (held is not None or whole):
            found.problems.append(
                f"{_named(head, at_line)}: the chain's row {head.seq} "
                + (f"has hash {held[:16]}..., rewritten at or before it" if held else "is missing")
            )
            break
    what = "the chain" if whole else "the export's chain"
    if found.newest.seq > last:
        cut = "its newest rows were cut" if whole else "rows were cut from the chain, or the export is older"
        found.problems.append(f"{_named(found.newest, number)}: {what} ends at chain row {last}, before it ({cut})")
    elif found.newest.seq not in chain:
        found.notes.append(
            f"chain row {found.newest.seq} (the newest witnessed head) is between the export's receipts: only that"
            " the export reaches past it is checked (`--db URL audit verify --witness` checks the whole chain)"
        )
    return found


def export_chain(lines: Iterable[str]) -> dict[int, str]:
    """seq -> chain hash of every chain entry an export's receipts carry (a line that is no receipt carries none:
    `receipts.verify_lines` reports it)."""
    found: dict[int, str] = {}
    for line in lines:
        try:
            segment = json.loads(line)["chain"]
            found.update((int(entry["seq"]), str(entry["chain_hash"])) for entry in segment)
        except (ValueError, KeyError, TypeError):
            continue
    return found
