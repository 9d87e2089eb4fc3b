"""Per-tool policy: what a tool does to the world, when a person must approve it, and how to check it.

A tool with no policy is treated as a write that always needs approval (fail closed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from gatedloop.tools.blocking import call_blocking
from gatedloop.tools.usage import UsageLimit

Effect = Literal["read", "write"]
DecisionType = Literal["approve", "edit", "reject", "respond"]
"""What a reviewer may answer for a gated call (LangChain's `DecisionType`); the checked answer itself is
`gatedloop.nodes.wire.hitl.Decision`."""
ALL_DECISIONS: tuple[DecisionType, ...] = ("approve", "edit", "reject", "respond")


@dataclass(frozen=True, init=False)
class CallContext:
    """Who is asking, handed to approval predicates and validators (from the graph's runtime context)."""

    user_id: str | None = None
    roles: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __init__(
        self, user_id: str | None = None, roles: Iterable[str] = frozenset(), extra: Mapping[str, Any] | None = None
    ) -> None:
        """`roles` as any collection of names (`{"finance"}`, a list from JSON), kept a frozenset: a type checker
        takes a dataclass's field types for its parameters, which would refuse the set the docs write."""
        object.__setattr__(self, "user_id", user_id)
        object.__setattr__(self, "roles", roles)
        object.__setattr__(self, "extra", {} if extra is None else extra)
        self.__post_init__()

    def __post_init__(self) -> None:
        """Roles may arrive as a list (from JSON: the SDK, Studio); keep them a frozenset."""
        if isinstance(self.roles, str):
            raise TypeError("CallContext.roles must be a collection of role names, not one string")
        object.__setattr__(self, "roles", frozenset(self.roles or ()))


ApprovalPredicate = Callable[[dict[str, Any], CallContext], bool]
Validator = Callable[[dict[str, Any], CallContext], "str | None"]
Reconciler = Callable[[dict[str, Any], str], Any]

MASK = "***"
RAW_ARGS = "__raw__"
"""Key under which unread argument text is shown (`{"__raw__": text}`: audit trail, `masked`), and under which
plans in checkpoints written before plans carried `unread` hold it (nodes/gate/call_arguments.py reads them)."""


@dataclass(frozen=True, init=False)
class ToolPolicy:
    """How gatedloop treats one tool.

    - `effect`: reads may run concurrently and be retried; writes run one at a time, at most once per call id.
    - `approval`: "never", "always", or a predicate on (args, context) that returns True when a person must approve.
    - `allowed_decisions`: what the reviewer may answer for this tool.
    - `timeout_s`: per-call wall clock; a read that exceeds it is a `timeout`, a write an unknown outcome.
    - `validator`: business checks on (args, context); returns a reason to refuse, or None.
    Under `ainvoke` on `open_async_sqlite`'s default (on the loop) the policy's functions run on the event loop,
    so they must not block; I/O belongs in the tool (on Postgres's async path each call goes to a worker thread:
    docs/use.md).
    - `roles`: if set, the caller needs at least one of these roles (`permission_denied` otherwise).
    - `reconcile(args, idempotency_key)`: asks the authoritative system whether a write whose outcome is
      unknown happened: its result if it did, None if it did not; raises if it cannot tell.
    - `max_calls`: per-request cap on calls of this tool (`budget_exhausted` beyond it).
    - `strict_json`: arguments must be exact JSON (default: True for writes, tolerant repair for reads).
    - `approvers`: roles; a reviewer needs one of them to decide this tool's calls (None: any reviewer).
    - `self_approval`: whether the requester may decide her own call (None: False when `approvers` is set).
    - `approvals_required`: distinct authorized reviewers who must approve (an edit restarts the count).
    - `approval_ttl_s`: a request older than this cannot be approved; the call is answered `approval_expired`.
    - `secret_args`: argument names whose values are masked in requests, audit, CLI, logs and stream events.
    - `review_note`: a line shown to the reviewer with every request for this tool (e.g. an MCP server's hints).
    - `remind_after_s`: a request that has waited this long gets a reminder notice (`approval_reminder`) and an
      audit row, once.
    - `escalate_after_s`, `backup_approvers`: a request that has waited this long may also be decided by a reviewer
      with one of the `backup_approvers` roles (an `approval_escalated` notice and an audit row say so); before
      then, only `approvers` may. Both or neither.
    - `preview`: what approving a call will do, in one line, from its arguments as the reviewer sees them
      (`secret_args` masked), e.g. `lambda a: f"moves {a['amount']} EUR to {a['to']}"`; shown on the card, in
      Slack and in `description`. A preview that raises is left out (and logged).
    - `justification`: the decisions that need the reviewer's reason (`"justification": "..."` in the decision):
      e.g. `("approve", "reject")`, `"approve"`, or True for every decision; a decision without one is refused and
      asked again. Any decision may carry one; it is kept in the decision's audit row and its receipt.
    - `grantable`: a reviewer who may decide this tool's calls may grant a standing approval of calls within
      bounds (`gatedloop grant create`, `runs.grant`), itself decided under this rule; off by default. Writes only:
      a grant's use is taken with the write's claim.
    - `limits`: `UsageLimit`s across every thread and process on the database (tools/usage.py), charged with the
      write's claim; a write over one asks a person or is refused, as the limit says. Writes only.
    """

    effect: Effect
    approval: Literal["never", "always"] | ApprovalPredicate
    allowed_decisions: tuple[DecisionType, ...]
    timeout_s: float
    validator: Validator | None
    roles: frozenset[str] | None
    reconcile: Reconciler | None
    max_calls: int | None
    strict_json: bool | None
    approvers: frozenset[str] | None
    self_approval: bool | None
    approvals_required: int
    approval_ttl_s: float | None
    secret_args: frozenset[str]
    review_note: str | None
    justification: tuple[DecisionType, ...] | DecisionType | bool
    preview: Callable[[dict[str, Any]], str] | None
    remind_after_s: float | None
    escalate_after_s: float | None
    backup_approvers: frozenset[str] | None
    grantable: bool
    limits: tuple[UsageLimit, ...]

    def __init__(
        self,
        effect: Effect = "write",
        approval: Literal["never", "always"] | ApprovalPredicate = "always",
        allowed_decisions: Iterable[DecisionType] = ALL_DECISIONS,
        timeout_s: float = 30.0,
        validator: Validator | None = None,
        roles: Iterable[str] | None = None,
        reconcile: Reconciler | None = None,
        max_calls: int | None = None,
        strict_json: bool | None = None,
        approvers: Iterable[str] | None = None,
        self_approval: bool | None = None,
        approvals_required: int = 1,
        approval_ttl_s: float | None = None,
        secret_args: Iterable[str] = frozenset(),
        review_note: str | None = None,
        justification: Iterable[DecisionType] | DecisionType | bool = (),
        preview: Callable[[dict[str, Any]], str] | None = None,
        remind_after_s: float | None = None,
        escalate_after_s: float | None = None,
        backup_approvers: Iterable[str] | None = None,
        grantable: bool = False,
        limits: Iterable[UsageLimit] = (),
    ) -> None:
        """Collections as the docs write them (`approvers={"finance"}`, `limits=[UsageLimit(...)]`), kept as
        frozensets and tuples: a type checker takes a dataclass's field types for its parameters, which would
        refuse them. The checks are `__post_init__`'s."""
        given = {name: value for name, value in locals().items() if name != "self"}
        for name, value in given.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "allowed_decisions", tuple(allowed_decisions))
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.effect not in ("read", "write"):
            raise ValueError(f"ToolPolicy.effect must be 'read' or 'write', not {self.effect!r}")
        if not (self.approval in ("never", "always") or callable(self.approval)):
            raise ValueError(f"ToolPolicy.approval must be 'never', 'always' or a callable, not {self.approval!r}")
        unknown = set(self.allowed_decisions) - set(ALL_DECISIONS)
        if unknown or not self.allowed_decisions:
            raise ValueError(f"ToolPolicy.allowed_decisions must be a non-empty subset of {ALL_DECISIONS}")
        if self.timeout_s <= 0:
            raise ValueError("ToolPolicy.timeout_s must be positive")
        for name in ("roles", "approvers", "secret_args", "backup_approvers"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"ToolPolicy.{name} must be a collection of names, not one string ({value!r})")
            if value is not None:
                object.__setattr__(self, name, frozenset(value))
        if self.approvers is not None and not self.approvers:
            raise ValueError("ToolPolicy.approvers must name at least one role (or be None: any reviewer)")
        if isinstance(self.approvals_required, bool) or not isinstance(self.approvals_required, int):
            raise ValueError("ToolPolicy.approvals_required must be an integer")
        if self.approvals_required < 1:
            raise ValueError("ToolPolicy.approvals_required must be at least 1")
        if self.approval_ttl_s is not None and self.approval_ttl_s <= 0:
            raise ValueError("ToolPolicy.approval_ttl_s must be positive (or None: no expiry)")
        for name in ("remind_after_s", "escalate_after_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise ValueError(f"ToolPolicy.{name} must be a positive number of seconds (or None)")
        if (self.escalate_after_s is None) != (self.backup_approvers is None) or self.backup_approvers == frozenset():
            raise ValueError("ToolPolicy.escalate_after_s and backup_approvers go together (seconds, and the roles)")
        if self.backup_approvers is not None and self.approvers is None:
            raise ValueError("ToolPolicy.backup_approvers needs approvers: with none, any reviewer may already decide")
        needs = _decisions_named(self.justification)
        if set(needs) - set(ALL_DECISIONS):
            raise ValueError(f"ToolPolicy.justification must name decisions of {ALL_DECISIONS} (or be True/False)")
        object.__setattr__(self, "justification", tuple(d for d in ALL_DECISIONS if d in needs))
        self._check_standing_rules()

    def _check_standing_rules(self) -> None:
        """Grants and limits are taken with a write's claim: a read has none, so neither could hold for it."""
        object.__setattr__(self, "limits", tuple(self.limits))
        if not all(isinstance(limit, UsageLimit) for limit in self.limits):
            raise ValueError("ToolPolicy.limits must be UsageLimit objects (gatedloop.tools.UsageLimit)")
        keys = [limit.key for limit in self.limits]
        if len(set(keys)) != len(keys):
            raise ValueError(f"ToolPolicy.limits: two limits share a counter ({keys}); give them different names")
        if self.effect == "read" and (self.grantable or self.limits):
            raise ValueError("ToolPolicy.grantable and limits apply to writes (taken with the write's claim)")

    def needs_approval(self, args: dict[str, Any], context: CallContext) -> bool:
        """A predicate that raises counts as "needs approval": fail closed."""
        if self.approval == "never":
            return False
        if self.approval == "always":
            return True
        try:
            return bool(call_blocking(self.approval, args, context))
        except Exception:
            return True

    @property
    def needs_justification(self) -> tuple[DecisionType, ...]:
        """The decisions that need a reviewer's reason (`justification`, as decision types)."""
        return cast("tuple[DecisionType, ...]", self.justification)

    @property
    def allows_self_approval(self) -> bool:
        return self.approvers is None if self.self_approval is None else self.self_approval

    def reviewer_refusal(
        self, reviewer: CallContext, requester: str | None, waited_s: float | None = None
    ) -> str | None:
        """Why this reviewer may not decide this tool's calls, or None. Identity comes from the runtime
        context of the call that answers (the server's authenticated user), never from the answer itself.
        `waited_s`: how long the call had waited when the decision was (or would be) made; past
        `escalate_after_s`, a `backup_approvers` role also decides."""
        if self.approvers is not None:
            if reviewer.user_id is None:
                return "deciding this call needs an identified reviewer (runtime context user_id)"
            backup = self.backup_approvers if self.escalated(waited_s) else None
            if not self.approvers & reviewer.roles and not (backup and backup & reviewer.roles):
                escalates = (
                    f" (after {self.escalate_after_s:g} s waiting, or one of {sorted(self.backup_approvers)})"
                    if self.backup_approvers and not backup
                    else f" or {sorted(backup)}"
                    if backup
                    else ""
                )
                return f"deciding this call needs one of the roles {sorted(self.approvers)}{escalates}"
        if not self.allows_self_approval:
            if reviewer.user_id is None:  # an answer with no identity could be the requester's own
                return "deciding this call needs an identified reviewer (the requester may not decide her own call)"
            if reviewer.user_id == requester:
                return "the requester may not decide her own call"
        return None

    def escalated(self, waited_s: float | None) -> bool:
        """Whether a call that has waited `waited_s` may be decided by the backup approvers."""
        return self.escalate_after_s is not None and waited_s is not None and waited_s >= self.escalate_after_s

    def masked(self, args: Any) -> dict[str, Any]:
        """A copy of `args` to show or log: each top-level argument named in `secret_args` has its value
        replaced by "***" (the whole value, however nested it is). Names are matched at the top level only,
        because `secret_args` names the tool's parameters; to hide a nested field, name its parameter.
        Unparsed argument text (`{"__raw__": text}`) of a tool with secrets is masked whole: nobody can tell
        which part of broken text is the secret."""
        if not isinstance(args, Mapping):  # forged or broken state: show it as unparsed text
            args = {RAW_ARGS: args}
        if not self.secret_args:
            return dict(args)
        if set(args) == {RAW_ARGS}:
            return {RAW_ARGS: MASK}
        return {key: MASK if key in self.secret_args else value for key, value in args.items()}

    @property
    def strict(self) -> bool:
        return self.effect == "write" if self.strict_json is None else self.strict_json

    def summary(self) -> dict[str, Any]:
        """The authority this policy gives, as JSON data: what a thread remembers of its graph's policies
        (`gatedloop.graph.parts_of.graph_identity`), so that a graph whose rules changed never resumes it unnoticed.

        Who may ask (`roles`), whether a person must approve (`effect`, `approval`), who may decide and how many
        (`approvers`, `self_approval` as it applies, `approvals_required`, and after how long the backup roles too:
        `escalate_after_s`, `backup_approvers`), for how long (`approval_ttl_s`), what
        they may answer (`allowed_decisions`) and what is hidden (`secret_args`). An approval predicate is code,
        which cannot be digested by value (its body, closure and bound state are not data): it is described by its
        qualified name (`described`), so replacing or renaming it is a change, and editing its body is not seen.
        Not included, because they grant no authority and are applied as they are now to every call anyway:
        `validator` (run again on the exact arguments before a write starts), `reconcile`, `timeout_s`,
        `max_calls`, `strict_json`, `review_note`, `preview`, `remind_after_s`, `limits` (they only ever ask or
        refuse more). `grantable` gives authority (a grant approves calls in a person's place): included when set."""
        approval = self.approval if isinstance(self.approval, str) else f"predicate:{described(self.approval)}"
        return {
            "effect": self.effect,
            "approval": approval,
            "roles": None if self.roles is None else sorted(self.roles),
            "approvers": None if self.approvers is None else sorted(self.approvers),
            "self_approval": self.allows_self_approval,
            "approvals_required": self.approvals_required,
            "approval_ttl_s": None if self.approval_ttl_s is None else float(self.approval_ttl_s),
            "allowed_decisions": [d for d in ALL_DECISIONS if d in self.allowed_decisions],
            "secret_args": sorted(self.secret_args),
            # only when set: the policies of threads recorded before it existed keep their digest
            **({"justification": list(self.needs_justification)} if self.needs_justification else {}),
            **(
                {"escalate_after_s": float(self.escalate_after_s), "backup_approvers": sorted(self.backup_approvers)}
                if self.escalate_after_s is not None and self.backup_approvers is not None
                else {}
            ),
            **({"grantable": True} if self.grantable else {}),
        }


def _decisions_named(value: Any) -> tuple[str, ...]:
    """`ToolPolicy.justification` as decision types: True is every decision, False none, a string one."""
    if isinstance(value, bool):
        return ALL_DECISIONS if value else ()
    return (value,) if isinstance(value, str) else tuple(value)


def described(fn: Callable[..., Any]) -> str:
    """A callable by its qualified name (`__qualname__`, e.g. `pay_policy.<locals>.<lambda>`): stable across
    processes and rebuilds, unlike its `repr` (an address). Not its module: the same file is `agent` when imported,
    `__main__` when run as a script, and named after its path when the CLI loads `path/agent.py:graph`, and none
    of these is a change of rules. A `functools.partial` is named by its function (its bound arguments are not),
    a callable object by its class."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    return str(getattr(target, "__qualname__", None) or type(target).__qualname__)


GATED_WRITE = ToolPolicy(effect="write", approval="always")
