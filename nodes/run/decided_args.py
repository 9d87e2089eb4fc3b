"""The arguments a call was decided with, held where nothing else reaches them and checked as the tool is called.

An approval is bound to `args_digest` of exact arguments (invariants 2 and 16). A middleware's `wrap_tool_call`, a
tool that writes its injected state, or a bug may change a call's arguments in place, at any depth. So the decided
arguments are deep-copied when the run is submitted, and each time the tool is called a fresh copy is digested and
compared with the decided digest: the tool receives exactly the arguments it was decided with, or nothing runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors
from gatedloop.tools.arguments import args_digest

ARGS_NOT_DECIDED = (
    "Not run: the arguments about to run are not the ones that were decided (validated or approved); "
    "the call was refused and the attempt audited."
)


@dataclass(frozen=True)
class DecidedArgs:
    """A call's decided arguments (a private copy), their digest, and the idempotency key injected beside them."""

    name: str
    args: dict[str, Any]
    digest: str
    idempotency_key: str | None = None

    @classmethod
    def of(cls, plan: CallPlan, idempotency_key: str | None = None) -> DecidedArgs:
        return cls(plan["name"], copy.deepcopy(plan["args"]), plan["digest"], idempotency_key)

    def checked(self) -> dict[str, Any]:
        """A fresh copy of the arguments for the tool, after checking it still has the decided digest."""
        args = copy.deepcopy(self.args)
        if args_digest(self.name, args) != self.digest:
            raise errors.ToolFailure(ARGS_NOT_DECIDED, error_type="call_changed")
        return args if self.idempotency_key is None else {**args, "idempotency_key": self.idempotency_key}
