"""gatedloop's policy for each AgentDojo v1 suite, written from the tools' descriptions alone.

These rules were written before any injection task (its goal, its ground truth or its checker) was read: the only
input was each tool's name, docstring and parameters, as a team would write a policy for tools it is given. One
question decides each rule: can the call move money, change who may get in, destroy something, or let someone other
than the user learn something? Then a person approves it. A read that only shows the user's own data to the model
runs alone; a read that sends its argument to an arbitrary host (a web fetch) is egress and is asked too. A
predicate asks only where the description names the risky argument (an event's participants get an e-mail; a
scheduled transfer's recipient or amount moves money).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gatedloop.tools import CallContext, ToolPolicy

READ = ToolPolicy(effect="read", approval="never")
"""Shows the user's own data to the model; nothing leaves, nothing changes."""
EGRESS_READ = ToolPolicy(effect="read", approval="always")
"""A read whose argument reaches any host on the web: the URL can carry data out, and the host is unknown."""
ASK = ToolPolicy(effect="write", approval="always")
"""Moves money, changes access or credentials, destroys something, or sends data to people."""
OWN_WRITE = ToolPolicy(effect="write", approval="never")
"""Changes only the user's own store, additively; nobody else is told."""


def emails_participants(args: dict[str, Any], context: CallContext) -> bool:
    """create_calendar_event: "It also sends an email to the participants with the event details"; with no
    participants the event stays in the user's own calendar."""
    return bool(args.get("participants"))


def redirects_money(args: dict[str, Any], context: CallContext) -> bool:
    """update_scheduled_transaction: a new recipient or amount changes where money goes; a new date or subject
    does not."""
    return args.get("recipient") is not None or args.get("amount") is not None


BANKING: dict[str, ToolPolicy] = {
    "get_iban": READ,
    "get_balance": READ,
    "get_most_recent_transactions": READ,
    "get_scheduled_transactions": READ,
    "get_user_info": READ,
    # A local file shown to the model; the path names nothing outside the machine.
    "read_file": READ,
    # Money leaves the account, now or later: a person confirms every transfer.
    "send_money": ASK,
    "schedule_transaction": ASK,
    "update_scheduled_transaction": ToolPolicy(effect="write", approval=redirects_money),
    # Credentials and the identity the bank mails things to: a takeover if wrong.
    "update_password": ASK,
    "update_user_info": ASK,
}

SLACK: dict[str, ToolPolicy] = {
    "get_channels": READ,
    "read_channel_messages": READ,
    "read_inbox": READ,
    "get_users_in_channel": READ,
    # The workspace's own members read these; nothing goes outside the workspace.
    "send_direct_message": OWN_WRITE,
    "send_channel_message": OWN_WRITE,
    # Who may read what: a channel's history to a user, the workspace to an outsider, or a member removed.
    "add_user_to_channel": ASK,
    "invite_user_to_slack": ASK,
    "remove_user_from_slack": ASK,
    # Any URL: the fetch sends the URL (and whatever is in it) to an unknown host; posting publishes content.
    "get_webpage": EGRESS_READ,
    "post_webpage": ASK,
}

TRAVEL: dict[str, ToolPolicy] = {
    # Returns the user's passport, bank and card numbers, but only to the model; sending them is what is gated.
    "get_user_information": READ,
    "get_all_hotels_in_city": READ,
    "get_hotels_prices": READ,
    "get_rating_reviews_for_hotels": READ,
    "get_hotels_address": READ,
    "get_all_restaurants_in_city": READ,
    "get_cuisine_type_for_restaurants": READ,
    "get_restaurants_address": READ,
    "get_rating_reviews_for_restaurants": READ,
    "get_dietary_restrictions_for_all_restaurants": READ,
    "get_contact_information_for_restaurants": READ,
    "get_price_for_restaurants": READ,
    "check_restaurant_opening_hours": READ,
    "get_all_car_rental_companies_in_city": READ,
    "get_car_types_available": READ,
    "get_rating_reviews_for_car_rental": READ,
    "get_car_fuel_options": READ,
    "get_car_rental_address": READ,
    "get_car_price_per_day": READ,
    "get_flight_information": READ,
    "search_calendar_events": READ,
    "get_day_calendar_events": READ,
    "create_calendar_event": ToolPolicy(effect="write", approval=emails_participants),
    # Cancelling e-mails every participant and cannot be undone.
    "cancel_calendar_event": ASK,
    # A reservation commits the user's money and name to a third party.
    "reserve_hotel": ASK,
    "reserve_car_rental": ASK,
    "reserve_restaurant": ASK,
    # Mail to any address, with any body: the user's data can leave.
    "send_email": ASK,
}

WORKSPACE: dict[str, ToolPolicy] = {
    # Marks the mail read: a change, but only of the user's own inbox flags.
    "get_unread_emails": READ,
    "get_sent_emails": READ,
    "get_received_emails": READ,
    "get_draft_emails": READ,
    "search_emails": READ,
    "search_contacts_by_name": READ,
    "search_contacts_by_email": READ,
    "get_current_day": READ,
    "search_calendar_events": READ,
    "get_day_calendar_events": READ,
    "search_files_by_filename": READ,
    "get_file_by_id": READ,
    "list_files": READ,
    "search_files": READ,
    # Mail to any address, with drive files as attachments: the user's data can leave.
    "send_email": ASK,
    # Deleting cannot be undone.
    "delete_email": ASK,
    "delete_file": ASK,
    "create_calendar_event": ToolPolicy(effect="write", approval=emails_participants),
    # Each of these e-mails the event's participants (new ones get its details).
    "cancel_calendar_event": ASK,
    "reschedule_calendar_event": ASK,
    "add_calendar_event_participants": ASK,
    # New content in the user's own drive; nobody else sees it unless a file is shared, which is asked.
    "create_file": OWN_WRITE,
    "append_to_file": OWN_WRITE,
    "share_file": ASK,
}

POLICIES: dict[str, dict[str, ToolPolicy]] = {
    "banking": BANKING,
    "slack": SLACK,
    "travel": TRAVEL,
    "workspace": WORKSPACE,
}


@dataclass(frozen=True)
class StandingGrant:
    """A grant a team would set ahead of time for the user's own work (`runs.grant`): calls of `tool` inside
    `where`, `uses` times a day."""

    tool: str
    where: tuple[str, ...]
    uses: int
    why: str


def workspace_grants(env: Any) -> list[StandingGrant]:
    """The workspace user's colleagues are the contacts at her own company's domain (from her account's address):
    mail and invitations to colleagues only (every recipient, copy and blind copy; every participant), read access
    to a file for one, and moving her own meetings."""
    domain = env.inbox.account_email.split("@")[1]
    colleagues = ",".join(sorted({c.email for c in env.inbox.contact_list if c.email.endswith(f"@{domain}")}))
    return [
        StandingGrant(
            "send_email",
            (f"recipients in {colleagues}", f"cc in {colleagues}", f"bcc in {colleagues}"),
            uses=5,
            why=f"mail whose every recipient, copy and blind copy is a colleague (a contact at {domain})",
        ),
        StandingGrant(
            "create_calendar_event",
            (f"participants in {colleagues}",),
            uses=5,
            why="an event whose every participant is a colleague (each is sent the invitation by e-mail)",
        ),
        StandingGrant(
            "add_calendar_event_participants",
            (f"participants in {colleagues}",),
            uses=5,
            why="colleagues added to an event of the user's (each is sent the invitation by e-mail)",
        ),
        StandingGrant(
            "share_file",
            (f"email in {colleagues}", "permission=r"),
            uses=5,
            why=f"read access to a file for a colleague (a contact at {domain})",
        ),
        StandingGrant(
            "reschedule_calendar_event",
            (),
            uses=5,
            why="moving the user's own meetings: the participants are told the new time, nothing else leaves",
        ),
    ]


def slack_grants(env: Any) -> list[StandingGrant]:
    """The workspace's own members into any channel but the one named private: nobody outside gets in."""
    channels = [c for c in env.slack.channels if c != "private"]
    return [
        StandingGrant(
            "add_user_to_channel",
            (f"user in {','.join(env.slack.users)}", f"channel in {','.join(channels)}"),
            uses=5,
            why="a member of the workspace into one of its channels (not `private`)",
        ),
    ]


GRANTS: dict[str, Callable[[Any], list[StandingGrant]]] = {"workspace": workspace_grants, "slack": slack_grants}
"""Standing grants per suite, from its environment (the user's identity, the workspace's members) and the tools'
descriptions; chosen after listing which of the user tasks' calls the policy asks about (to see where asking is),
and before any injection task was read for them."""


def with_grants(policies: dict[str, ToolPolicy], grants: list[StandingGrant]) -> dict[str, ToolPolicy]:
    """The policies with the granted tools opted in (`grantable=True`); every rule otherwise the same."""
    granted = {g.tool for g in grants}
    return {name: replace(p, grantable=True) if name in granted else p for name, p in policies.items()}
