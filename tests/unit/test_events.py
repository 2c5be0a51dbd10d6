"""Event validation: what `prepare()` accepts, how it normalizes, and what it rejects."""

from __future__ import annotations

import dataclasses
import enum
import json
import pickle
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal
from uuid import RFC_4122, UUID, SafeUUID

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.errors import InvalidEvent
from sinal.events import (
    EmitEvent,
    EmitResult,
    PreparedEvent,
    StoredPayload,
    build_unique_event_id,
    differs_from,
    differs_from_earlier,
    prepare,
)
from sinal.ids import new_id

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
BRT = timezone(timedelta(hours=-3))
ACCOUNT = "0192f5d0-1a2b-7c3d-8e4f-000000000001"
CONTACT = "0192f5d0-1a2b-7c3d-8e4f-000000000002"
WAMID = "wamid.HBgMNTUxMTk4NzY1NDMyMRUCABIYFjNFQjBDMEE1"
NAN = float("nan")
INF = float("inf")


def make(**changes: Any) -> EmitEvent:
    """A valid event ("Order Placed" from Shopify), with `changes` applied."""
    fields: dict[str, Any] = {
        "account_id": ACCOUNT,
        "contact_id": CONTACT,
        "metric_name": "Order Placed",
        "source": "shopify",
    }
    return EmitEvent(**{**fields, **changes})


def accept(**changes: Any) -> PreparedEvent:
    return prepare(make(**changes), NOW)


def is_sentence(message: str) -> bool:
    return message == message.strip() and len(message.split()) >= 3


def rejections(**changes: Any) -> list[tuple[str, str]]:
    """The (field, code) pairs `prepare()` reports, after checking each message reads well."""
    with pytest.raises(InvalidEvent) as excinfo:
        prepare(make(**changes), NOW)
    errors = excinfo.value.errors
    assert errors, "InvalidEvent must list at least one field"
    for error in errors:
        assert is_sentence(error.message), error
    assert str(excinfo.value).startswith(f"{errors[0].field}: ")
    return [(error.field, error.code) for error in errors]


def nested_objects(levels: int) -> dict[str, Any]:
    """`levels` objects inside one another: {"a": {"a": ... {"leaf": 1}}}."""
    inner: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        inner = {"a": inner}
    return inner


def nested_arrays(levels: int) -> list[Any]:
    inner: list[Any] = [1]
    for _ in range(levels - 1):
        inner = [inner]
    return inner


# --- metric_name -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("\t\n", "empty"),
        ("x" * 129, "too_long"),
        ("  " + "x" * 129 + "  ", "too_long"),
        ("Order\nPlaced", "control_characters"),
        ("Order Placed\x07", "control_characters"),
        ("\x07Order Placed", "control_characters"),
        ("Order\x00Placed", "control_characters"),
        ("Order\ud800Placed", "control_characters"),  # lone surrogate: not storable as UTF-8
        ("__webhook__", "reserved"),
        ("__anything", "reserved"),
        (" __webhook__ ", "reserved"),
        (None, "invalid_type"),
        (123, "invalid_type"),
        (b"Order Placed", "invalid_type"),
        # a system metric mistyped would be a custom metric of its own, counted apart
        ("order paid", "misspelt_system_metric"),
        ("ORDER_PAID", "misspelt_system_metric"),
        (" message-read ", "misspelt_system_metric"),
        ("Order  Paid", "misspelt_system_metric"),
    ],
)
def test_metric_name_rejects_bad_names(raw: object, code: str) -> None:
    assert rejections(metric_name=raw) == [("metric_name", code)]


@pytest.mark.parametrize(
    ("raw", "name", "category", "is_system", "display_name"),
    [
        ("Order Placed", "Order Placed", "ecommerce", True, "Order Placed"),
        ("  Order Placed  ", "Order Placed", "ecommerce", True, "Order Placed"),
        ("\tMessage Read\n", "Message Read", "messaging", True, "Message Read"),
        ("Shipment Delivered", "Shipment Delivered", "tracking", True, "Shipment Delivered"),
        ("Link Clicked", "Link Clicked", "engagement", True, "Link Clicked"),
        ("Tag Added", "Tag Added", "contact", True, "Tag Added"),
        ("AI Response Sent", "AI Response Sent", "messaging", True, "AI Response Sent"),
        (
            "Loyalty Points Earned",
            "Loyalty Points Earned",
            "custom",
            False,
            "Loyalty Points Earned",
        ),
        (" Pontos de fidelidade ", "Pontos de fidelidade", "custom", False, "Pontos de fidelidade"),
        ("_single_underscore", "_single_underscore", "custom", False, "_single_underscore"),
        ("x" * 128, "x" * 128, "custom", False, "x" * 128),
    ],
)
def test_metric_name_is_stripped_and_categorized(
    raw: str, name: str, category: str, is_system: bool, display_name: str
) -> None:
    event = accept(metric_name=raw)
    assert event.metric_name == name
    assert event.category == category
    assert event.is_system is is_system
    assert event.display_name == display_name


# --- properties ------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [[1, 2], ["a"], "abc", "{}", 5, 1.5, True])
def test_properties_rejects_what_is_not_an_object(raw: object) -> None:
    assert rejections(properties=raw) == [("properties", "not_object")]


@pytest.mark.parametrize("raw", [None, {}])
def test_properties_default_to_an_empty_object(raw: object) -> None:
    event = accept(properties=raw)
    assert (event.properties, event.properties_json) == ({}, "{}")


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        # strings: NUL cannot be stored in PostgreSQL text/jsonb; lone surrogates not as UTF-8
        ({"a": "x\x00y"}, [("properties.a", "nul_character")]),
        ({"a\x00": 1}, [("properties key", "nul_character")]),
        ({"a": {"b\x00": 1}}, [("properties.a key", "nul_character")]),
        ({"a": "\ud800"}, [("properties.a", "lone_surrogate")]),
        ({"\ud800": 1}, [("properties key", "lone_surrogate")]),
        ({"a": ["ok", "x\udfff"]}, [("properties.a[1]", "lone_surrogate")]),
        # numbers JSON cannot hold
        ({"a": NAN}, [("properties.a", "not_finite")]),
        ({"a": INF}, [("properties.a", "not_finite")]),
        ({"a": -INF}, [("properties.a", "not_finite")]),
        ({"a": {"b": [1, NAN]}}, [("properties.a.b[1]", "not_finite")]),
        ({"a": Decimal("NaN")}, [("properties.a", "not_finite")]),
        ({"a": Decimal("sNaN")}, [("properties.a", "not_finite")]),
        ({"a": Decimal("-Infinity")}, [("properties.a", "not_finite")]),
        ({"a": 2**64}, [("properties.a", "out_of_range")]),
        ({"a": [-(2**63) - 1]}, [("properties.a[0]", "out_of_range")]),
        # keys must be strings
        ({1: "x"}, [("properties", "non_string_key")]),
        ({(1, 2): "x"}, [("properties", "non_string_key")]),
        ({None: "x"}, [("properties", "non_string_key")]),
        ({"a": {1: "x"}}, [("properties.a", "non_string_key")]),
        # types JSON has no word for
        ({"a": {1, 2}}, [("properties.a", "invalid_type")]),
        ({"a": object()}, [("properties.a", "invalid_type")]),
        ({"a": b"bytes"}, [("properties.a", "invalid_type")]),
        ({"a": [1, {"b": frozenset()}]}, [("properties.a[1].b", "invalid_type")]),
    ],
)
def test_properties_rejects_unstorable_values_with_their_path(
    properties: dict[Any, Any], expected: list[tuple[str, str]]
) -> None:
    assert rejections(properties=properties) == expected


def test_properties_reports_every_bad_value_in_one_error() -> None:
    properties = {"a": NAN, "b": {1: "x"}, "c": "\x00", "d": {1, 2}, "ok": "fine"}
    assert rejections(properties=properties) == [
        ("properties.a", "not_finite"),
        ("properties.b", "non_string_key"),
        ("properties.c", "nul_character"),
        ("properties.d", "invalid_type"),
    ]


# {"b":"…"} is 8 bytes around the text; the limit is 64 KiB of UTF-8 JSON.
@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("x" * (65536 - 8), True),
        ("x" * (65536 - 7), False),
        ("é" * 32764, True),  # 2 bytes each: 65528 + 8 bytes
        ("é" * 32765, False),  # fewer than 64 Ki characters, but more than 64 KiB
    ],
)
def test_properties_are_limited_to_64_kib_of_json(text: str, accepted: bool) -> None:
    if accepted:
        event = accept(properties={"b": text})
        assert len(event.properties_json.encode()) <= 64 * 1024
    else:
        assert rejections(properties={"b": text}) == [("properties", "too_large")]


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        (nested_objects(16), None),
        (nested_objects(17), [("properties" + ".a" * 16, "too_deep")]),
        ({"a": nested_arrays(15)}, None),
        ({"a": nested_arrays(16)}, [("properties.a" + "[0]" * 15, "too_deep")]),
        ({"a": [{"b": nested_arrays(13)}]}, None),
        ({"a": [{"b": nested_arrays(14)}]}, [("properties.a[0].b" + "[0]" * 13, "too_deep")]),
    ],
)
def test_properties_nest_at_most_16_levels(
    properties: dict[str, Any], expected: list[tuple[str, str]] | None
) -> None:
    if expected is None:
        event = accept(properties=properties)
        assert orjson.loads(event.properties_json) == properties
    else:
        assert rejections(properties=properties) == expected


@pytest.mark.parametrize(
    "properties",
    [
        {"a": [1.5], "b": "null"},  # no bracket to spare, and the text null
        {f"k{i}": [i] for i in range(20)},  # more brackets than levels
        {"a": None, "b": {"c": [None, 2.5]}},
    ],
    ids=["null-text", "many-siblings", "nulls"],
)
def test_properties_checks_each_float_whatever_the_json_text_looks_like(
    properties: dict[str, Any],
) -> None:
    """A non-finite float is written by orjson as null: it is caught whether or not the
    object's JSON text has other nulls, or more brackets than nesting levels."""
    assert orjson.loads(accept(properties=properties).properties_json) == properties
    spoiled = {**properties, "z": [NAN]}
    assert rejections(properties=spoiled) == [("properties.z[0]", "not_finite")]


def test_properties_keys_of_a_str_subclass_are_stored_as_their_text() -> None:
    # orjson refuses a str subclass as a key: prepare raised its TypeError (and emit_many
    # with it, for the whole batch)
    class Key(str):
        pass

    class Field(enum.StrEnum):
        TOTAL = "total"

    event = accept(properties={Key("sku"): Key("A-1"), Field.TOTAL: 2, "n": {Key("x"): 1}})
    assert event.properties_json == '{"sku":"A-1","total":2,"n":{"x":1}}'


def test_properties_serialize_decimals_as_strings_and_datetimes_as_iso() -> None:
    event = accept(
        properties={
            "price": Decimal("297.90"),
            "paid_at": datetime(2026, 11, 29, 9, 30, tzinfo=BRT),
            "tags": ("vip", "recompra"),
            "note": None,
            "gift": False,
            "items": 2,
            "weight": 1.25,
            "nome": "Ana Luísa 🌻",
        }
    )
    expected = {
        "price": "297.90",
        "paid_at": "2026-11-29T09:30:00-03:00",
        "tags": ["vip", "recompra"],
        "note": None,
        "gift": False,
        "items": 2,
        "weight": 1.25,
        "nome": "Ana Luísa 🌻",
    }
    assert event.properties == expected
    assert orjson.loads(event.properties_json) == expected


_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_JSON_TEXT = st.text(
    st.characters(exclude_categories=_SURROGATES, exclude_characters="\x00"), max_size=20
)
_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _JSON_TEXT
)
# max_leaves=8 lets st.recursive apply its extension at most 4 times: with the outer
# object, properties nest at most 5 levels.
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_JSON_TEXT, children, max_size=4)
    ),
    max_leaves=8,
)


@settings(database=None, max_examples=300)  # no .hypothesis/ directory: unit tests do no I/O
@given(st.dictionaries(_JSON_TEXT, _JSON_VALUES, max_size=6))
def test_properties_round_trip_any_json_object(properties: dict[str, Any]) -> None:
    event = accept(properties=properties)
    assert event.properties == properties
    assert orjson.loads(event.properties_json) == properties


# --- value -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (NAN, "not_finite"),
        (INF, "not_finite"),
        (-INF, "not_finite"),
        (Decimal("NaN"), "not_finite"),
        (Decimal("sNaN"), "not_finite"),
        (Decimal("Infinity"), "not_finite"),
        ("NaN", "not_finite"),
        ("-Infinity", "not_finite"),
        (True, "not_a_number"),
        (False, "not_a_number"),
        ("abc", "not_a_number"),
        ("297,90", "not_a_number"),  # a Brazilian decimal comma is not guessed at
        ("R$ 297.90", "not_a_number"),
        # Texts are written as JSON numbers (the API schema's pattern); Decimal() took these
        (" 297.90 ", "not_a_number"),
        ("297.90\n", "not_a_number"),
        ("\u00a0297.90", "not_a_number"),
        ("1_000", "not_a_number"),
        ("\u0661\u0660", "not_a_number"),  # Arabic-Indic 10
        ("\uff15", "not_a_number"),  # fullwidth 5
        ("+5", "not_a_number"),
        ("1e", "not_a_number"),
        ("1e+", "not_a_number"),
        (".5", "not_a_number"),
        ("5.", "not_a_number"),
        ("-", "not_a_number"),
        ("", "not_a_number"),
        ("1" * 65, "not_a_number"),
        ([297], "not_a_number"),
        ({"amount": 297}, "not_a_number"),
        (10**14, "out_of_range"),
        (-(10**14), "out_of_range"),
        (1e14, "out_of_range"),
        (Decimal("1e14"), "out_of_range"),
        ("100000000000000.0000", "out_of_range"),
        # Past the decimal context's exponents: abs() signalled Overflow (a 500 in the API)
        (Decimal("1E1000000"), "out_of_range"),
        ("-1E1000000", "out_of_range"),
        (Decimal("1E-1000000"), "too_precise"),
        (Decimal("0.00001"), "too_precise"),
        ("297.90001", "too_precise"),
        ("297.90000001", "too_precise"),
        (1.23456, "too_precise"),
        (1e-5, "too_precise"),
    ],
)
def test_value_rejects_what_numeric_18_4_cannot_hold(raw: object, code: str) -> None:
    assert rejections(value=raw) == [("value", code)]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (297, "297"),
        (0, "0"),
        (Decimal("297.90"), "297.90"),
        ("297.90", "297.90"),
        ("1000", "1000"),
        ("1e3", "1000"),
        ("1.5E+2", "150"),
        ("2975e-1", "297.5"),
        (Decimal("1E+3"), "1000"),  # only texts have a form: a Decimal is a number
        (297.9, "297.9"),  # the float's shortest text, not 297.899999999999977262632...
        (0.1, "0.1"),
        (-0.0, "0.0"),
        (Decimal("-0"), "0"),
        ("-0.00", "0.00"),
        (Decimal("0.0001"), "0.0001"),
        (Decimal("99999999999999.9999"), "99999999999999.9999"),
        ("-99999999999999.9999", "-99999999999999.9999"),
        (10**14 - 1, "99999999999999"),
        # Zeros past the fourth place change nothing: the value is kept at four
        ("297.9000000", "297.9000"),
        ("1.234500", "1.2345"),
        (Decimal("0E-10"), "0.0000"),
        ("-0.000000", "0.0000"),
        ("99999999999999.99990000", "99999999999999.9999"),
    ],
)
def test_value_is_kept_as_an_exact_decimal(raw: object, expected: str) -> None:
    value = accept(value=raw).value
    assert isinstance(value, Decimal)
    assert str(value) == expected


def test_value_is_optional() -> None:
    assert accept(value=None).value is None


# --- currency --------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["XYZ", "US", "usd1", "R$", " usd", "USDT", 123])
def test_currency_rejects_codes_outside_iso_4217(raw: object) -> None:
    assert rejections(currency=raw) == [("currency", "invalid_currency")]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("usd", "USD"), ("USD", "USD"), ("eur", "EUR"), ("BRL", "BRL"), (None, "BRL"), ("", "BRL")],
)
def test_currency_is_upper_cased_and_defaults_to_brl(raw: str | None, expected: str) -> None:
    assert accept(currency=raw).currency == expected


# --- occurred_at -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (datetime(2026, 11, 29, 9, 0), "naive_datetime"),
        ("2026-01-01T00:00:00", "naive_datetime"),
        ("2026-01-01", "naive_datetime"),
        ("yesterday", "invalid_datetime"),
        ("29/11/2026 09:00", "invalid_datetime"),
        ("2026-11-29T09:00:00" + " " * 60, "invalid_datetime"),
        (1764417600, "invalid_datetime"),  # epoch seconds are not guessed at
        (datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC), "out_of_window"),
        ("1999-12-31T23:59:59Z", "out_of_window"),
        ("2000-01-01T00:00:00+01:00", "out_of_window"),  # 1999-12-31T23:00Z
        (NOW + timedelta(hours=25), "out_of_window"),
        (NOW + timedelta(hours=24, microseconds=1), "out_of_window"),
        # Before year 1 or after 9999 once in UTC: datetime cannot hold them there.
        ("0001-01-01T00:00:00+01:00", "out_of_window"),
        ("9999-12-31T23:59:59-01:00", "out_of_window"),
        (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), "out_of_window"),
    ],
)
def test_occurred_at_rejects_unusable_timestamps(raw: object, code: str) -> None:
    assert rejections(occurred_at=raw) == [("occurred_at", code)]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (NOW + timedelta(hours=23), NOW + timedelta(hours=23)),
        (NOW + timedelta(hours=24), NOW + timedelta(hours=24)),
        (datetime(2000, 1, 1, tzinfo=UTC), datetime(2000, 1, 1, tzinfo=UTC)),
        (datetime(2026, 11, 29, 9, 0, tzinfo=BRT), NOW),
        ("2026-11-29T09:00:00-03:00", NOW),
        ("2026-11-29T12:00:00Z", NOW),
        ("2026-11-29T12:00:00.250Z", NOW + timedelta(milliseconds=250)),
        ("2026-11-29T13:00:00+01:00", NOW),
    ],
)
def test_occurred_at_is_converted_to_utc(raw: datetime | str, expected: datetime) -> None:
    event = accept(occurred_at=raw)
    assert event.occurred_at == expected
    assert event.occurred_at.tzinfo is UTC
    assert event.occurred_at_given is True


@pytest.mark.parametrize("raw", [None, ""])
def test_occurred_at_defaults_to_now(raw: str | None) -> None:
    event = accept(occurred_at=raw)
    assert event.occurred_at == NOW
    assert event.occurred_at_given is False
    assert event.received_at == NOW


def test_every_field_of_a_prepared_event_comes_from_its_own_input() -> None:
    """`prepare()` builds the event positionally: each field gets a distinct value here,
    so two swapped arguments cannot pass."""
    integration, execution = UUID(int=3), UUID(int=4)
    event = accept(
        metric_name="Order Paid",
        properties={"order_id": "1001"},
        value="297.90",
        currency="usd",
        source="shopify",
        source_id="1001",
        integration_id=integration,
        entity_type="order",
        entity_id="gid-1001",
        automation_execution_id=execution,
        occurred_at="2026-11-29T09:00:00-03:00",
    )
    assert event._asdict() | {"id": None} == {
        "id": None,
        "account_id": UUID(ACCOUNT),
        "contact_id": UUID(CONTACT),
        "metric_name": "Order Paid",
        "category": "ecommerce",
        "is_system": True,
        "display_name": "Order Paid",
        "properties_json": '{"order_id":"1001"}',
        "value": Decimal("297.90"),
        "currency": "USD",
        "source": "shopify",
        "source_id": "1001",
        "integration_id": integration,
        "unique_event_id": "shopify:order:1001",
        "entity_type": "order",
        "entity_id": "gid-1001",
        "automation_execution_id": execution,
        "occurred_at": NOW,
        "occurred_at_given": True,
        "received_at": NOW,
    }
    assert event.id.version == 7


# --- UUID fields -----------------------------------------------------------------------

UUID_FIELDS = ["account_id", "contact_id", "integration_id", "automation_execution_id"]


@pytest.mark.parametrize("name", UUID_FIELDS)
@pytest.mark.parametrize(
    "raw",
    ["not-a-uuid", "1234", 123, ACCOUNT + "0", pytest.param(10**5000, id="int-of-5001-digits")],
)
def test_uuid_fields_reject_what_is_not_a_uuid(name: str, raw: object) -> None:
    assert rejections(**{name: raw}) == [(name, "invalid_uuid")]


def test_an_integer_too_long_to_write_is_named_by_its_size() -> None:
    # repr() of an int of more than 4,300 digits raises ValueError: the message that
    # quotes the input raised it instead of InvalidEvent
    assert rejections(currency=10**5000, properties={10**5000: 1}) == [
        ("properties", "non_string_key"), ("currency", "invalid_currency"),
    ]  # fmt: skip
    with pytest.raises(InvalidEvent, match="got an integer of 16610 bits"):
        prepare(make(integration_id=10**5000), NOW)


@pytest.mark.parametrize("raw", [None, ""])
def test_account_id_is_required(raw: str | None) -> None:
    assert rejections(account_id=raw) == [("account_id", "required")]


@pytest.mark.parametrize("name", UUID_FIELDS)
@pytest.mark.parametrize("raw", [UUID(CONTACT), CONTACT, CONTACT.upper()])
def test_uuid_fields_accept_uuids_and_their_text(name: str, raw: UUID | str) -> None:
    assert getattr(accept(**{name: raw}), name) == UUID(CONTACT)


@pytest.mark.parametrize("name", ["contact_id", "integration_id", "automation_execution_id"])
def test_optional_uuid_fields_may_be_absent(name: str) -> None:
    # A missing contact is the ledger's to reject (it may resolve one); prepare() allows it.
    assert getattr(accept(**{name: None}), name) is None


def test_from_automation_is_true_only_with_an_execution_id() -> None:
    assert accept().from_automation is False
    assert accept(automation_execution_id=CONTACT).from_automation is True


# --- source, entity_type, source_id, entity_id -----------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "code"),
    [
        ("source", None, "required"),
        ("source", "", "required"),
        ("source", "x" * 65, "too_long"),
        ("source", "shopify:orders", "invalid_format"),
        ("source", "my source", "invalid_format"),
        ("source", " shopify", "invalid_format"),
        ("source", "lojá", "invalid_format"),
        ("source", 123, "invalid_type"),
        ("entity_type", "x" * 65, "too_long"),
        ("entity_type", "order:line", "invalid_format"),
        ("entity_type", "line item", "invalid_format"),
        ("entity_type", 123, "invalid_type"),
    ],
)
def test_tokens_reject_what_would_break_the_unique_id(name: str, raw: object, code: str) -> None:
    assert rejections(**{name: raw}) == [(name, code)]


@pytest.mark.parametrize("name", ["source", "entity_type"])
@pytest.mark.parametrize("raw", ["shopify", "meta/whatsapp", "v1.2_x-Y", "x" * 64])
def test_tokens_accept_letters_digits_and_punctuation(name: str, raw: str) -> None:
    assert getattr(accept(**{name: raw}), name) == raw


@pytest.mark.parametrize("raw", [None, ""])
def test_entity_type_is_optional(raw: str | None) -> None:
    assert accept(entity_type=raw).entity_type is None


@pytest.mark.parametrize("name", ["source_id", "entity_id"])
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("x" * 256, "too_long"),
        ("abc\n", "control_characters"),
        ("a\x00b", "control_characters"),
        ("\x1b[31m", "control_characters"),
        ("a\ud800", "control_characters"),
        (1.5, "invalid_type"),
        (True, "invalid_type"),
        (["1001"], "invalid_type"),
        (10**256, "too_long"),
        # more digits than str() writes: its ValueError came out of prepare before
        pytest.param(10**5000, "too_long", id="int-of-5001-digits"),
    ],
)
def test_external_ids_reject_long_or_control_text(name: str, raw: object, code: str) -> None:
    assert rejections(**{name: raw}) == [(name, code)]


@pytest.mark.parametrize("name", ["source_id", "entity_id"])
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (1001, "1001"),
        (0, "0"),
        ("1001", "1001"),
        (WAMID, WAMID),
        ("x" * 255, "x" * 255),
        (" spaced id ", " spaced id "),
        (None, None),
        ("", None),
    ],
)
def test_external_ids_keep_their_text(name: str, raw: object, expected: str | None) -> None:
    assert getattr(accept(**{name: raw}), name) == expected


def test_prepare_reports_every_bad_field_in_one_error() -> None:
    assert rejections(
        account_id="nope",
        contact_id=42,
        metric_name="",
        source="a b",
        source_id="x" * 256,
        properties=[1],
        value="abc",
        currency="XYZ",
        occurred_at="yesterday",
    ) == [
        ("account_id", "invalid_uuid"),
        ("contact_id", "invalid_uuid"),
        ("metric_name", "empty"),
        ("source", "invalid_format"),
        ("source_id", "too_long"),
        ("properties", "not_object"),
        ("value", "not_a_number"),
        ("currency", "invalid_currency"),
        ("occurred_at", "invalid_datetime"),
    ]


# --- unique_event_id -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"source": "whatsapp", "entity_type": "message", "source_id": WAMID},
            f"whatsapp:message:{WAMID}",
        ),
        ({"source": "shopify", "entity_type": "order", "source_id": 1001}, "shopify:order:1001"),
        ({"source": "shopify", "source_id": "1001"}, "shopify:event:1001"),
        ({"source": "shopify", "entity_type": "", "source_id": "1001"}, "shopify:event:1001"),
        ({"source": "shopify", "entity_type": "order"}, None),
        ({"source": "shopify", "source_id": ""}, None),
    ],
)
def test_unique_event_id_joins_source_entity_type_and_source_id(
    changes: dict[str, Any], expected: str | None
) -> None:
    assert accept(**changes).unique_event_id == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("whatsapp", "message", WAMID), f"whatsapp:message:{WAMID}"),
        (("yampi", None, "42"), "yampi:event:42"),
        (("yampi", "", "42"), "yampi:event:42"),
    ],
)
def test_build_unique_event_id_follows_the_seed_format(
    args: tuple[str, str | None, str], expected: str
) -> None:
    assert build_unique_event_id(*args) == expected


def test_prepare_gives_each_event_a_new_time_ordered_id() -> None:
    first, second = accept(), accept()
    assert first.id != second.id
    assert first.id.version == 7


def test_new_ids_are_plain_uuids_in_creation_order() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for made in ids[:: len(ids) // 10]:
        parsed = UUID(str(made))
        assert (made, hash(made), made.version, made.variant) == (
            parsed,
            hash(parsed),
            7,
            RFC_4122,
        )
        assert made.is_safe is SafeUUID.unknown
        assert pickle.loads(pickle.dumps(made)) == made


def test_as_input_is_json_ready() -> None:
    event = accept(value=297.9, properties={"price": Decimal("297.90")}, occurred_at=NOW)
    data = orjson.loads(orjson.dumps(event.as_input()))
    assert data["value"] == "297.9"
    assert data["properties"] == {"price": "297.90"}
    assert data["occurred_at"] == "2026-11-29T12:00:00Z"
    assert data["contact_id"] == CONTACT


# --- differs_from ----------------------------------------------------------------------

STORED_AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def stored_copy(event: PreparedEvent, **changes: Any) -> StoredPayload:
    """The stored side of `event` as PostgreSQL gives it back (jsonb's text: spaced, keys
    in its own order, not sinal's text), with `changes` (`properties` as an object)."""
    properties = changes.pop("properties", orjson.loads(event.properties_json))
    stored = StoredPayload(
        metric_name=event.metric_name,
        properties_json=json.dumps(properties, sort_keys=True),
        value=event.value,
        currency=event.currency,
        occurred_at=event.occurred_at,
    )
    return dataclasses.replace(stored, **changes)


@pytest.mark.parametrize(
    ("stored_changes", "expected"),
    [
        ({}, False),
        ({"value": Decimal("297.90")}, False),  # the same amount, written differently
        ({"value": Decimal("297.9000")}, False),
        ({"value": Decimal("298")}, True),
        ({"value": None}, True),
        ({"properties": {"order": "1001", "items": 2}}, True),
        ({"properties": {"order": "1001"}}, True),
        ({"metric_name": "Order Paid"}, True),
        ({"currency": "USD"}, True),
        ({"occurred_at": STORED_AT - timedelta(seconds=1)}, True),
    ],
)
def test_differs_from_compares_the_payload(stored_changes: dict[str, Any], expected: bool) -> None:
    event = accept(value=297.9, properties={"order": "1001", "items": 3}, occurred_at=STORED_AT)
    assert differs_from(event, stored_copy(event, **stored_changes)) is expected


def test_differs_from_reads_properties_stored_as_sinal_wrote_them() -> None:
    """SQLite gives back the text sinal wrote; PostgreSQL its own: both are the same
    properties, and another text of other properties is not."""
    event = accept(properties={"order": "1001", "items": [1, {"b": None, "a": 2.5}]})
    as_written = dataclasses.replace(stored_copy(event), properties_json=event.properties_json)
    assert stored_copy(event).properties_json != event.properties_json
    assert differs_from(event, stored_copy(event)) is False
    assert differs_from(event, as_written) is False
    other = dataclasses.replace(as_written, properties_json='{"order": "1001"}')
    assert differs_from(event, other) is True


@pytest.mark.parametrize(
    ("first", "then", "expected"),
    [
        ({"paid": True}, {"paid": 1}, True),
        ({"paid": False}, {"paid": 0}, True),
        ({"a": [False]}, {"a": [0]}, True),
        ({"a": {"b": [1, True]}}, {"a": {"b": [1, 1]}}, True),
        ({"paid": True}, {"paid": True}, False),
        ({"n": 1}, {"n": 1.0}, False),  # equal numbers, as jsonb says
        ({"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2.0}]}, False),
        ({"a": [1]}, {"a": [1, 2]}, True),
        ({"a": 1}, {"a": 1, "b": None}, True),
    ],
)
def test_differs_from_never_takes_a_boolean_for_a_number(
    first: dict[str, Any], then: dict[str, Any], expected: bool
) -> None:
    stored = accept(properties=first)
    repeat = accept(properties=then)
    assert differs_from_earlier(repeat, stored) is expected
    assert differs_from(repeat, stored_copy(stored)) is expected


@pytest.mark.parametrize(
    ("occurred_at", "expected"),
    [
        (None, False),  # a retry that let occurred_at default to "now" is the same event
        (STORED_AT, False),
        ("2026-11-29T07:00:00-03:00", False),  # the same instant
        (STORED_AT + timedelta(minutes=1), True),
    ],
)
def test_differs_from_counts_occurred_at_only_when_given(
    occurred_at: datetime | str | None, expected: bool
) -> None:
    event = accept(occurred_at=occurred_at)
    stored = stored_copy(event, occurred_at=STORED_AT)
    assert differs_from(event, stored) is expected


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, False),
        ({"properties": {"items": 3, "order": "1001"}}, False),  # other key order, same object
        ({"properties": {"order": "1001", "items": 4}}, True),
        ({"value": "297.90"}, False),
        ({"value": 298}, True),
        ({"currency": "USD"}, True),
        ({"occurred_at": None}, False),  # a repeat that let occurred_at default
        ({"occurred_at": STORED_AT + timedelta(minutes=1)}, True),
    ],
)
def test_a_repeat_in_the_same_batch_is_compared_with_its_first(
    changes: dict[str, Any], expected: bool
) -> None:
    first = accept(value=297.9, properties={"order": "1001", "items": 3}, occurred_at=STORED_AT)
    base: dict[str, Any] = {
        "value": 297.9, "properties": {"order": "1001", "items": 3}, "occurred_at": STORED_AT,
    }  # fmt: skip
    repeat = accept(**{**base, **changes})
    assert differs_from_earlier(repeat, first) is expected
    assert differs_from(repeat, stored_copy(first)) is expected  # as if already stored


# --- EmitResult ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"), [("created", True), ("duplicate", True), ("rejected", False)]
)
def test_emit_result_is_stored_unless_rejected(status: Any, expected: bool) -> None:
    assert EmitResult(status=status).is_stored is expected


def test_names_and_tokens_found_valid_once_are_answered_alike_again() -> None:
    """Valid metric names and tokens are remembered (a platform repeats a few); a repeat
    gets the same normalized answer, and an invalid value is never remembered."""
    for _ in range(2):
        event = accept(metric_name="  Cupom Aplicado ", source="loja-x", entity_type="cupom")
        assert (event.metric_name, event.source, event.entity_type) == (
            "Cupom Aplicado",
            "loja-x",
            "cupom",
        )
        assert rejections(metric_name="__Cupom") == [("metric_name", "reserved")]
        assert rejections(source="loja x") == [("source", "invalid_format")]
        assert rejections(metric_name=" " * 3) == [("metric_name", "empty")]
