"""`gatedloop keys init` and `gatedloop audit sign|export|verify`: the evidence chain for operators and auditors.

`audit verify FILE.jsonl --public-key KEY` needs no database (an auditor's machine); `gatedloop --db URL audit
verify` checks the live ledger. Either exits non-zero naming the first row that does not hold (docs/evidence.md);
with `--witness FILE`, also when the chain ends before, or differs from, a head published to that file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from gatedloop.checkpoints.chain import (
    ALLOW_UNSIGNED_GENESIS,
    KEY_ENV,
    PUBLIC_KEY_ENV,
    SignedHead,
    Signer,
    Verifier,
    load_verifier,
    signer_from_env,
    verify_chain,
    write_key_pair,
)
from gatedloop.checkpoints.receipts import build_receipts, receipt_line, verify_lines
from gatedloop.checkpoints.witness import (
    WITNESS_ENV,
    WitnessCheck,
    append_head,
    check_witness,
    export_chain,
    witness_from_env,
)
from gatedloop.cli.app import EXIT_COMPLETED, EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE, CliError, open_saver, shown_db
from gatedloop.cli.output import Output

DEFAULT_KEY_DIR = "gatedloop-keys"


def _signer(args: argparse.Namespace) -> Signer | None:
    try:
        if getattr(args, "key", None):
            return Signer.from_pem(Path(args.key).expanduser().read_bytes())
        return signer_from_env()
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load the signing key ({KEY_ENV} or --key): {exc}", EXIT_USAGE) from None


def _verifier(args: argparse.Namespace) -> Verifier | None:
    """--public-key, else GATEDLOOP_PUBLIC_KEY, else the public half of GATEDLOOP_SIGNING_KEY; None: no key."""
    value = args.public_key or os.environ.get(PUBLIC_KEY_ENV)
    try:
        if value:
            return load_verifier(value)
        signer = signer_from_env()
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load the public key: {exc}", EXIT_USAGE) from None
    return signer.verifier if signer else None


def cmd_keys_init(args: argparse.Namespace) -> int:
    out = Output(args.json)
    try:
        private, public, signer = write_key_pair(args.out)
    except (FileExistsError, OSError) as exc:
        raise CliError(f"keys init: {exc}", EXIT_USAGE) from None
    out.record("keys", private_key=str(private), public_key=str(public), key_id=signer.key_id)
    out.say(f"signing key {private} (mode 0600), public key {public}, key id {signer.key_id}")
    out.say(f"sign with: export {KEY_ENV}={private}  (keep the private key off the database host if you can)")
    return EXIT_COMPLETED


def cmd_audit_sign(args: argparse.Namespace) -> int:
    out = Output(args.json)
    signer = _signer(args)
    if signer is None:
        raise CliError(
            f"no signing key: set {KEY_ENV} (PEM or a path) or give --key (see gatedloop keys init)", EXIT_USAGE
        )
    witness = args.witness or witness_from_env()
    with open_saver(args.db) as saver:
        saver.ledger.signer = signer
        saver.ledger.witness = None  # appended below, where a failure is this command's
        head = saver.ledger.sign_head()
        signed = [entry for entry in saver.ledger.chain(max(head - 1, 0)) if entry.seq == head]
    chain_hash = signed[0].chain_hash if signed else None
    if witness and signed and signed[0].signature:
        _witness_head(witness, SignedHead(head, signed[0].chain_hash, signed[0].signature, time.time()))
    out.record("signed", db=shown_db(args.db), seq=head, chain_hash=chain_hash, key_id=signer.key_id, witness=witness)
    out.say(
        f"signed chain row {head} ({chain_hash}) with key {signer.key_id}"
        + (f"; appended to the witness {witness}" if witness else "")
        if head
        else "no chain yet"
    )
    return EXIT_COMPLETED


def _witness_head(witness: str, head: SignedHead) -> None:
    try:
        append_head(witness, head)
    except OSError as exc:
        raise CliError(
            f"signed chain row {head.seq}, but the witness {witness} was not written: {exc}", EXIT_FAILED
        ) from None


def since_time(text: str | None) -> float | None:
    """--since: seconds since the epoch, or an ISO 8601 time (UTC unless it names its zone)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--since {text!r}: give an ISO 8601 time (2026-01-31T12:00Z) or epoch seconds", EXIT_USAGE
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def cmd_audit_export(args: argparse.Namespace) -> int:
    out = Output(args.json)
    signer = _signer(args)
    with open_saver(args.db, read_only=signer is None) as saver:
        if signer is not None:
            saver.ledger.signer = signer
        receipts = build_receipts(saver.ledger, thread=args.thread, since=since_time(args.since), signer=signer)
    target = Path(args.out)
    with target.open("w", encoding="utf-8") as handle:
        for receipt in receipts:
            handle.write(receipt_line(receipt) + "\n")
    unsigned = sum(not r["signed"] for r in receipts)
    out.record("export", out=str(target), receipts=len(receipts), unsigned=unsigned)
    out.say(
        f"{len(receipts)} receipts in {target}"
        + (f" ({unsigned} not covered by a signature: no signing key)" if unsigned else "")
    )
    return EXIT_COMPLETED


def _witnessed(
    args: argparse.Namespace, chain: Mapping[int, str], verifier: Verifier | None, whole: bool
) -> WitnessCheck:
    """The chain at hand (seq -> hash) against `--witness FILE`; nothing to check without one."""
    if not args.witness:
        return WitnessCheck()
    path = Path(args.witness).expanduser()
    if not path.is_file():
        raise CliError(f"no witness file at {path}", EXIT_NOT_FOUND)
    with path.open(encoding="utf-8") as handle:
        return check_witness(handle, chain, verifier, whole=whole)


def cmd_audit_verify(args: argparse.Namespace) -> int:
    out = Output(args.json)
    verifier = _verifier(args)
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise CliError(f"no receipts file at {path}", EXIT_NOT_FOUND)
        with path.open(encoding="utf-8") as handle:
            report = verify_lines(handle, verifier)
        with path.open(encoding="utf-8") as handle:
            witness = _witnessed(args, export_chain(handle), verifier, whole=False)
        for note in witness.notes:
            out.say(f"note: {note}")
        return _finish(
            out,
            report.problems + witness.problems,
            f"{report.receipts} receipts verify"
            + (f" against key {verifier.key_id}" if verifier else " (hashes only: no --public-key)")
            + (f"; {report.unsigned} not covered by a signature" if report.unsigned else "")
            + (witness.reached() if args.witness else ""),
            receipts=report.receipts,
            notes=witness.notes,
        )
    with open_saver(args.db, read_only=True) as saver:
        entries = saver.ledger.chain()
        chain = verify_chain(
            entries, saver.ledger.chained_rows, verifier, allow_unsigned_genesis=args.allow_unsigned_genesis
        )
    witness = _witnessed(args, {entry.seq: entry.chain_hash for entry in entries}, verifier, whole=True)
    notes = chain.notes + witness.notes
    for note in notes:
        out.say(f"note: {note}")
    summary = (
        f"{chain.entries} chain rows verify ({chain.begins}); head: chain row {chain.head[0]}, {chain.head[1]}"
        + (f"; signed up to chain row {chain.signed_up_to} with key {verifier.key_id}" if verifier else "")
        if chain.entries and chain.head
        else "no chain yet"
    ) + (witness.reached() if args.witness else "")
    head = {"seq": chain.head[0], "chain_hash": chain.head[1]} if chain.head else None
    return _finish(
        out,
        chain.problems + witness.problems,
        summary,
        entries=chain.entries,
        begins=chain.begins,
        head=head,
        notes=notes,
    )


def _finish(out: Output, problems: list[str], summary: str, **fields: object) -> int:
    if problems:
        out.record("verify", ok=False, first_bad=problems[0], problems=problems, **fields)
        if not out.as_json:
            print(f"gatedloop: evidence does not verify: {problems[0]}", file=sys.stderr)
            for problem in problems[1:6]:
                print(f"  also: {problem}", file=sys.stderr)
        return EXIT_FAILED
    out.record("verify", ok=True, **fields)
    out.say(summary)
    return EXIT_COMPLETED


def add_commands(command: Callable[[str, str], argparse.ArgumentParser], shared: argparse.ArgumentParser) -> None:
    """The `keys` and `audit` commands, on the main parser's `command` factory."""
    keys = command("keys", "make the Ed25519 key pair that signs the evidence chain")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, parser_class=type(keys))
    init = keys_sub.add_parser("init", help="write signing.key (mode 0600) and signing.pub", parents=[shared])
    init.add_argument("--out", default=DEFAULT_KEY_DIR, metavar="DIR", help=f"where (default: ./{DEFAULT_KEY_DIR})")
    init.set_defaults(func=cmd_keys_init)

    audit = command("audit", "sign, export and verify the evidence chain (docs/evidence.md)")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True, parser_class=type(audit))
    key_help = f"the signing key's PEM file ({KEY_ENV}: PEM text or a path)"
    sign = audit_sub.add_parser("sign", help="sign the chain's head now", parents=[shared])
    sign.add_argument("--key", metavar="FILE", help=key_help)
    sign.add_argument(
        "--witness", metavar="FILE", help=f"append the signed head to this witness file (default: {WITNESS_ENV})"
    )
    sign.set_defaults(func=cmd_audit_sign)
    export = audit_sub.add_parser(
        "export", help="one receipt per decision and executed write (JSONL)", parents=[shared]
    )
    export.add_argument("--out", required=True, metavar="FILE.jsonl")
    export.add_argument("--thread", help="only this thread's receipts")
    export.add_argument("--since", metavar="TIME", help="only from this time (ISO 8601, or epoch seconds)")
    export.add_argument("--key", metavar="FILE", help=key_help + "; the head is signed before the export")
    export.set_defaults(func=cmd_audit_export)
    verify = audit_sub.add_parser(
        "verify",
        help="check receipts offline (FILE), or the live ledger (--db); names the first bad row",
        parents=[shared],
    )
    verify.add_argument("file", nargs="?", metavar="FILE.jsonl", help="an export to check without the database")
    verify.add_argument(
        "--public-key", metavar="KEY", help=f"PEM file or text ({PUBLIC_KEY_ENV}; default: {KEY_ENV}'s public half)"
    )
    verify.add_argument(
        "--witness",
        metavar="FILE",
        help="also fail when the chain ends before, or differs from, a head published to this witness file",
    )
    verify.add_argument(
        ALLOW_UNSIGNED_GENESIS,
        action="store_true",
        help="with a key, accept an unsigned genesis (a chain begun by an older gatedloop): the rows it counts as"
        " earlier are then unchecked, as the output says",
    )
    verify.set_defaults(func=cmd_audit_verify)
