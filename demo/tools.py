"""The demo tools from the articles, as LangChain tools over a `DemoStore`, with their policies.

Argument formats (dates, times, lengths) live in the schemas, so a bad call is refused at validation, before
anyone is asked to approve it. The write tools take an injected `idempotency_key` the model never sees; the
store deduplicates on it and `reconcile` looks it up after an unknown outcome.
"""

from datetime import date as Date
from typing import Annotated, Any

from langchain_core.tools import BaseTool, InjectedToolArg, tool
from pydantic import AfterValidator, Field

from gatedloop.demo.calculator import MAX_LENGTH, safe_eval
from gatedloop.demo.store import NOT_FOUND, WORKSHOP_FULL, DemoStore
from gatedloop.tools.errors import ToolFailure
from gatedloop.tools.policy import CallContext, ToolPolicy

READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 15.0
END_BEFORE_START = "The event must end after it starts."


def _real_date(value: str) -> str:
    Date.fromisoformat(value)
    return value


IsoDate = Annotated[
    str,
    Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$", description="Date as YYYY-MM-DD, e.g. 2026-03-06"),
    AfterValidator(_real_date),
]
ClockTime = Annotated[str, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="24-hour time as HH:MM")]
Name = Annotated[str, Field(min_length=1, max_length=100)]
Key = Annotated[str, InjectedToolArg]


def _not_found(what: str, key: str) -> ToolFailure:
    return ToolFailure(NOT_FOUND.format(what=what, key=key), error_type="invalid_arguments")


def build_demo_tools(store: DemoStore) -> list[BaseTool]:
    """The nine demo tools, each bound to `store`."""

    @tool
    def query_order(
        order_id: Annotated[str, Field(min_length=1, max_length=64, description="Order number, e.g. ORD-2026-001")],
    ) -> dict[str, Any]:
        """Look up an order's status and its logistics tracking number."""
        if (order := store.get_order(order_id)) is None:
            raise _not_found("Order", order_id)
        return order

    @tool
    def query_logistics(
        tracking_no: Annotated[str, Field(min_length=1, max_length=64, description="Tracking number, e.g. SF123456")],
    ) -> dict[str, Any]:
        """Look up the latest logistics event for a tracking number (get it from query_order first)."""
        if (track := store.get_logistics(tracking_no)) is None:
            raise _not_found("Tracking number", tracking_no)
        return track

    @tool
    def get_weather(
        city: Annotated[str, Field(min_length=1, max_length=64, description="City, e.g. 北京")],
    ) -> dict[str, Any]:
        """Get today's weather (temperature in celsius and condition) for a city."""
        if (weather := store.get_weather(city)) is None:
            raise _not_found("Weather for city", city)
        return weather

    @tool
    def calculator(
        expression: Annotated[
            str, Field(min_length=1, max_length=MAX_LENGTH, description="Arithmetic, e.g. (12 + 3) * 4")
        ],
    ) -> dict[str, Any]:
        """Compute an arithmetic expression exactly (numbers, + - * / // % ** and parentheses only)."""
        return {"expression": expression, "result": safe_eval(expression)}

    @tool
    def check_calendar(date: IsoDate, user: Name = "me") -> dict[str, Any]:
        """List a person's busy and free slots (09:00-18:00) on a date; user "me" is the person you assist."""
        if (calendar := store.get_calendar(date, user)) is None:
            raise _not_found("User", user)
        return calendar

    @tool
    def lookup_contact(name: Name) -> dict[str, Any]:
        """Find a contact's email address by name."""
        if (contact := store.get_contact(name)) is None:
            raise _not_found("Contact", name)
        return contact

    @tool
    def create_event(
        title: Name,
        date: IsoDate,
        start: ClockTime,
        end: ClockTime,
        attendees: Annotated[list[Name], Field(max_length=50, description="Attendee emails or names")],
        idempotency_key: Key,
    ) -> dict[str, Any]:
        """Create an event on the user's calendar (needs approval); returns the event with its id."""
        if end <= start:
            raise ToolFailure(END_BEFORE_START, error_type="invalid_arguments")
        return store.create_event(
            title=title, date=date, start=start, end=end, attendees=attendees, idempotency_key=idempotency_key
        )

    @tool
    def get_train_status(
        train_no: Annotated[str, Field(min_length=1, max_length=16, description="Train number, e.g. G1234")],
        date: IsoDate,
    ) -> dict[str, Any]:
        """Get whether a train runs on time or is delayed (and by how many minutes) on a date."""
        if (status := store.get_train_status(train_no, date)) is None:
            raise _not_found("Train", train_no)
        return status

    @tool
    def reserve_seat(
        event_id: Annotated[str, Field(min_length=1, max_length=32, description="Workshop id, e.g. WS-101")],
        participant: Name,
        idempotency_key: Key,
    ) -> dict[str, Any]:
        """Reserve a workshop seat for a participant (needs approval); returns the booking and seats left."""
        return store.reserve_seat(event_id=event_id, participant=participant, idempotency_key=idempotency_key)

    return [
        query_order,
        query_logistics,
        get_weather,
        calculator,
        check_calendar,
        lookup_contact,
        create_event,
        get_train_status,
        reserve_seat,
    ]


def demo_policies(store: DemoStore) -> dict[str, ToolPolicy]:
    """Reads run freely; writes need approval, are checked before a reviewer is asked, reconcile by key."""

    def event_times(args: dict[str, Any], _: CallContext) -> str | None:
        return END_BEFORE_START if str(args.get("end", "")) <= str(args.get("start", "")) else None

    def seat_available(args: dict[str, Any], _: CallContext) -> str | None:
        event_id = str(args.get("event_id", ""))
        if (workshop := store.get_workshop(event_id)) is None:
            return NOT_FOUND.format(what="Workshop", key=event_id)
        return WORKSHOP_FULL.format(event_id=workshop["event_id"]) if workshop["seats_left"] <= 0 else None

    read = ToolPolicy(effect="read", approval="never", timeout_s=READ_TIMEOUT_S)
    reads = [
        "query_order",
        "query_logistics",
        "get_weather",
        "calculator",
        "check_calendar",
        "lookup_contact",
        "get_train_status",
    ]
    return {
        **dict.fromkeys(reads, read),
        "create_event": ToolPolicy(
            effect="write",
            approval="always",
            timeout_s=WRITE_TIMEOUT_S,
            validator=event_times,
            reconcile=lambda _args, key: store.find_event_by_key(key),
        ),
        "reserve_seat": ToolPolicy(
            effect="write",
            approval="always",
            timeout_s=WRITE_TIMEOUT_S,
            validator=seat_available,
            reconcile=lambda _args, key: store.find_reservation_by_key(key),
        ),
    }
