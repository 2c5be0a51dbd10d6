"""Contact identity normalization: what a user typing or a provider sending a value gets."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.contacts import (
    Identities,
    InvalidIdentities,
    InvalidIdentity,
    normalize_contact_fields,
    normalize_email,
    normalize_external_id,
    normalize_name,
    normalize_phone,
    normalize_wa_id,
    phone_variants,
)

# --- phone -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+55 11 98765-4321", "+5511987654321"),
        ("(11) 98765-4321", "+5511987654321"),
        ("11987654321", "+5511987654321"),
        ("5511987654321", "+5511987654321"),  # WhatsApp wa_id
        ("011 98765 4321", "+5511987654321"),  # trunk prefix 0
        ("0 21 11 98765-4321", "+5511987654321"),  # trunk 0 + carrier code 21
        ("+55 (11) 9 8765-4321", "+5511987654321"),
        ("  +55.11.98765.4321  ", "+5511987654321"),
        ("+55\u00a011\u00a098765-4321", "+5511987654321"),  # no-break spaces from copy-paste
        ("＋５５１１９８７６５４３２１", "+5511987654321"),  # full-width characters
        # copied from WhatsApp's apps (bidi marks around it) or a word processor (dashes)
        ("\u202a+55 11 98765-4321\u202c", "+5511987654321"),
        ("\u2068(11) 98765\u20114321\u2069", "+5511987654321"),
        ("11 98765\u20134321\u200b", "+5511987654321"),
        ("+55 11 98765\u20144321", "+5511987654321"),
        ("4733221100", "+554733221100"),  # national reading wins over "+47 33221100"
    ],
)
def test_normalize_phone_accepts_common_brazilian_formats(raw: str, expected: str) -> None:
    assert normalize_phone(raw) == expected


@pytest.mark.parametrize(
    ("without_ninth", "with_ninth", "canonical"),
    [
        ("+55 11 8765-4321", "+55 11 98765-4321", "+5511987654321"),
        ("551187654321", "5511987654321", "+5511987654321"),  # wa_id forms
        ("(21) 7654-3210", "(21) 97654-3210", "+5521976543210"),
        ("+55 47 9988-7766", "+55 47 99988-7766", "+5547999887766"),
        ("558598765432", "5585998765432", "+5585998765432"),
        ("(61) 6123-4567", "(61) 96123-4567", "+5561961234567"),
    ],
)
def test_normalize_phone_adds_missing_ninth_digit_to_brazilian_mobiles(
    without_ninth: str, with_ninth: str, canonical: str
) -> None:
    assert normalize_phone(without_ninth) == canonical
    assert normalize_phone(with_ninth) == canonical


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+55 11 3456-7890", "+551134567890"),
        ("(21) 2345-6789", "+552123456789"),
        ("554733221100", "+554733221100"),
        ("(85) 5432-1098", "+558554321098"),
    ],
)
def test_normalize_phone_leaves_brazilian_landlines_untouched(raw: str, expected: str) -> None:
    assert normalize_phone(raw) == expected
    assert phone_variants(expected) == (expected,)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+1 650 253 0000", "+16502530000"),
        ("16502530000", "+16502530000"),  # wa_id of a US contact
        ("+351 912 345 678", "+351912345678"),
        ("351912345678", "+351912345678"),
        ("+44 7911 123456", "+447911123456"),
        ("447911123456", "+447911123456"),
    ],
)
def test_normalize_phone_keeps_foreign_numbers_out_of_the_brazilian_rule(
    raw: str, expected: str
) -> None:
    assert normalize_phone(raw) == expected
    assert phone_variants(expected) == (expected,)


@pytest.mark.parametrize(
    ("wa_id", "expected"),
    [
        ("51987654321", "+51987654321"),  # Peru, not Porto Alegre's (51) 98765-4321
        ("6591234567", "+6591234567"),  # Singapore, not Cuiabá's (65) 9123-4567
        ("34912345678", "+34912345678"),  # Spain, not Uberlândia's (34) 91234-5678
        ("16502530000", "+16502530000"),
        ("447911123456", "+447911123456"),
        ("5511987654321", "+5511987654321"),
        ("551187654321", "+5511987654321"),  # Meta's 12-digit form: the ninth digit added
        ("554733221100", "+554733221100"),  # a landline gains no 9
    ],
)
def test_normalize_wa_id_reads_whatsapp_ids_as_international(wa_id: str, expected: str) -> None:
    assert normalize_wa_id(wa_id) == expected


def test_normalize_phone_still_reads_typed_digits_as_brazilian_first() -> None:
    # The same digits typed by a person of a Brazilian account are a Porto Alegre mobile.
    assert normalize_phone("51987654321") == "+5551987654321"
    assert normalize_wa_id("5551987654321") == normalize_phone("(51) 98765-4321")


@pytest.mark.parametrize("wa_id", ["", "abc", "11987654321", "0123456789", "+999 1234 5678"])
def test_normalize_wa_id_rejects_what_is_not_an_international_number(wa_id: str) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_wa_id(wa_id)
    assert (excinfo.value.field, excinfo.value.code) == ("phone", "invalid_phone")


def test_normalize_phone_reads_national_numbers_in_the_given_region() -> None:
    assert normalize_phone("(650) 253-0000", default_region="US") == "+16502530000"
    assert normalize_phone("5511987654321", default_region="US") == "+5511987654321"


def test_normalize_phone_refuses_an_unknown_region_as_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown region") as excinfo:
        normalize_phone("11987654321", default_region="XX")
    assert not isinstance(excinfo.value, InvalidIdentity)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "phone number is empty"),
        ("   ", "phone number is empty"),
        ("+", "phone number has no digits"),
        ("()-", "phone number has no digits"),
        ("abc", "may contain only digits"),
        ("0800-FLORES", "may contain only digits"),  # no vanity letters
        ("(11) 98765-4321 ext 2", "may contain only digits"),
        ("+55 +11 98765-4321", "may contain only digits"),
        ("٠١١٩٨٧٦٥٤٣٢١", "may contain only digits 0-9"),  # Arabic-Indic digits
        ("1" * 65, "longer than 64 characters"),
        ("123", "is not valid"),
        ("98765-4321", "is not valid"),  # no DDD: the area cannot be guessed
        ("+55 11 1234-5678", "is not valid"),  # 8 digits starting with 1
        ("+55 11 987654", "is not valid"),
        ("+999 1234 5678", "is not valid"),  # no such country code
    ],
)
def test_normalize_phone_rejects_invalid_input_with_field_and_code(raw: str, message: str) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_phone(raw)
    assert (excinfo.value.field, excinfo.value.code) == ("phone", "invalid_phone")
    assert message in excinfo.value.message
    assert str(excinfo.value).startswith("phone: ")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+5511987654321", ("+5511987654321", "+551187654321")),
        ("551187654321", ("+5511987654321", "+551187654321")),
        ("+5585998765432", ("+5585998765432", "+558598765432")),
        # a modern mobile whose subscriber starts 9-2..5 has no legacy form: without the 9
        # it would be someone's landline
        ("+5511923456789", ("+5511923456789",)),
        ("+551134567890", ("+551134567890",)),
        ("+447911123456", ("+447911123456",)),
    ],
)
def test_phone_variants_lists_the_legacy_form_of_brazilian_mobiles(
    raw: str, expected: tuple[str, ...]
) -> None:
    assert phone_variants(raw) == expected


# Several real DDDs; subscribers start 6-9 (mobiles, with or without the 9) or 2-5 (fixed).
_DDDS = ["11", "21", "31", "47", "51", "61", "71", "85", "91", "99"]
_subscribers = st.one_of(
    st.from_regex(r"9[6-9][0-9]{7}", fullmatch=True),
    st.from_regex(r"[6-9][0-9]{7}", fullmatch=True),
    st.from_regex(r"[2-5][0-9]{7}", fullmatch=True),
)
_brazilian_inputs = st.builds(
    lambda prefix, ddd, subscriber: f"{prefix}{ddd}{subscriber}",
    st.sampled_from(["", "0", "55", "+55 ", "+55", "(", "0 "]),
    st.sampled_from(_DDDS),
    _subscribers,
)
_any_inputs = st.one_of(
    _brazilian_inputs,
    st.text(alphabet="0123456789+ -()", max_size=20),
    st.from_regex(r"\+?[1-9][0-9]{7,14}", fullmatch=True),
)


@settings(database=None, max_examples=300)  # no .hypothesis/ directory: unit tests do no I/O
@given(_any_inputs)
def test_normalize_phone_is_idempotent_and_variants_map_back(raw: str) -> None:
    try:
        canonical = normalize_phone(raw)
    except InvalidIdentity:
        return
    assert normalize_phone(canonical) == canonical
    assert all(normalize_phone(variant) == canonical for variant in phone_variants(canonical))


# --- email -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("ana@loja.com.br", "ana@loja.com.br"),
        ("  Ana.Silva@Loja.COM.br ", "ana.silva@loja.com.br"),  # one contact, any case
        ("first+tag@example.org", "first+tag@example.org"),
        ("o'neil@example.ie", "o'neil@example.ie"),
        ("cliente@Bücher.de", "cliente@xn--bcher-kva.de"),  # IDN domain, punycode
        ("joão@exemplo.com.br", "joão@exemplo.com.br"),  # UTF-8 local part kept
        ("x@sub-domain.example.co", "x@sub-domain.example.co"),
        ("joa\u0303o@exemplo.com.br", "joão@exemplo.com.br"),  # decomposed: NFC
    ],
)
def test_normalize_email_lowercases_and_encodes_the_domain(raw: str, expected: str) -> None:
    assert normalize_email(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # as a Japanese or Chinese keyboard types them: the address a user sees
        ("ａｎａ@ｅｘａｍｐｌｅ.com", "ana@example.com"),
        ("ana＠example.com", "ana@example.com"),
        ("ＡＮＡ．ＳＩＬＶＡ＠ＬＯＪＡ．ＣＯＭ．ＢＲ", "ana.silva@loja.com.br"),
        ("\u3000ａｎａ@example.com\u3000", "ana@example.com"),  # ideographic spaces
        ("ｶﾞｲ@example.jp", "ガイ@example.jp"),  # half-width katakana, voiced mark composed
        ("ガイ@example.jp", "ガイ@example.jp"),
        ("δοκιμή@παράδειγμα.δοκιμή", "δοκιμή@xn--hxajbheg2az3al.xn--jxalpdlp"),
    ],
)
def test_normalize_email_reads_full_and_half_width_forms_as_the_usual_ones(
    raw: str, expected: str
) -> None:
    assert normalize_email(raw) == expected


@pytest.mark.parametrize(
    "local", ["\ufb01nance", "ana\u00b2", "\u00b5", "\u2460ana", "1\u00aa.ana"]
)
def test_normalize_email_refuses_other_compatibility_characters_before_the_at(
    local: str,
) -> None:
    # "ﬁnance" prints as "finance": kept, it was a second contact for the same address;
    # mapped, "ana²" would be ana2's mailbox, which may be another person's
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_email(f"{local}@loja.com")
    assert (excinfo.value.field, excinfo.value.code) == ("email", "invalid_email")
    assert "compatibility character before the '@'" in excinfo.value.message


@settings(database=None, max_examples=300)
@given(st.text(max_size=12), st.sampled_from(["loja.com", "ｌｏｊａ.com", "bücher.de"]))
def test_normalize_email_is_idempotent(local: str, domain: str) -> None:
    try:
        once = normalize_email(f"{local}@{domain}")
    except InvalidIdentity:
        return
    assert normalize_email(once) == once


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "is empty"),
        ("ana.loja.com", "exactly one '@'"),
        ("ana@@loja.com", "exactly one '@'"),
        ("a@b@loja.com", "exactly one '@'"),
        ("@loja.com", "nothing before the '@'"),
        ("a" * 65 + "@loja.com", "more than 64 bytes"),
        ("ana silva@loja.com", "characters not allowed"),
        ('"ana"@loja.com', "characters not allowed"),
        ("ana\u200b@loja.com", "characters not allowed"),
        (".ana@loja.com", "repeat '.'"),
        ("ana.@loja.com", "repeat '.'"),
        ("ana..silva@loja.com", "repeat '.'"),
        ("ana@localhost", "domain with a dot"),
        ("ana@", "domain with a dot"),
        ("ana@loja..com", "invalid domain"),
        ("ana@-loja.com", "invalid domain"),
        ("ana@loja-.com", "invalid domain"),
        ("ana@lo_ja.com", "invalid domain"),
        ("ana@loja.com.", "invalid domain"),
        ("ana@10.0.0.1", "invalid domain"),
        ("ana@" + "a" * 64 + ".com", "invalid domain"),
        ("a@" + ".".join(["a" * 60] * 5) + ".com", "longer than 254 bytes"),
    ],
)
def test_normalize_email_rejects_malformed_addresses_with_field_and_code(
    raw: str, message: str
) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_email(raw)
    assert (excinfo.value.field, excinfo.value.code) == ("email", "invalid_email")
    assert message in excinfo.value.message


# --- external id and name ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  shopify-123 ", "shopify-123"),
        ("gid://shopify/Customer/7261", "gid://shopify/Customer/7261"),
        ("Cliente ABC", "Cliente ABC"),  # case and inner spaces are the source's business
        ("x" * 255, "x" * 255),
        ("Jose\u0301", "José"),  # decomposed, as some systems send it: one id, in NFC
        ("No\u0303o-\u00ba1", "Nõo-\u00ba1"),  # no compatibility mapping: "º" stays
        ("e\u0301" * 255, "é" * 255),  # measured once composed
    ],
)
def test_normalize_external_id_strips_and_keeps_the_rest(raw: str, expected: str) -> None:
    assert normalize_external_id(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "is empty"),
        ("  \t ", "is empty"),
        ("x" * 256, "longer than 255 characters"),
        ("abc\x00def", "control or invisible"),
        ("abc\ndef", "control or invisible"),
        ("abc\u200bdef", "control or invisible"),  # zero-width space
    ],
)
def test_normalize_external_id_rejects_bad_ids_with_field_and_code(raw: str, message: str) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_external_id(raw)
    assert (excinfo.value.field, excinfo.value.code) == ("external_id", "invalid_external_id")
    assert message in excinfo.value.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("  \t\n ", None),
        ("  Ana   Maria\tda\nSilva  ", "Ana Maria da Silva"),
        ("Jose\u0301", "José"),  # NFC: a decomposed accent matches the composed one
        ("Ana 👩\u200d💻", "Ana 👩\u200d💻"),  # zero-width joiner inside an emoji stays
        ("a" * 200, "a" * 200),
    ],
)
def test_normalize_name_collapses_whitespace_and_blank_is_none(
    raw: str | None, expected: str | None
) -> None:
    assert normalize_name(raw) == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [("a" * 201, "too_long"), ("Ana\x00Silva", "invalid_name"), ("Ana\x07", "invalid_name")],
)
def test_normalize_name_rejects_long_or_control_names(raw: str, code: str) -> None:
    with pytest.raises(InvalidIdentity) as excinfo:
        normalize_name(raw)
    assert (excinfo.value.field, excinfo.value.code) == ("name", code)


# --- Identities --------------------------------------------------------------------------


def test_identities_parse_normalizes_every_given_value() -> None:
    identities = Identities.parse(
        phone="(11) 8765-4321", email=" Ana@Loja.com ", external_id=" c-1 "
    )
    assert identities == Identities(phone="+5511987654321", email="ana@loja.com", external_id="c-1")
    assert not identities.is_empty


def test_identities_parse_treats_none_as_absent() -> None:
    identities = Identities.parse(email="ana@loja.com")
    assert identities == Identities(email="ana@loja.com")
    assert Identities.parse().is_empty
    assert Identities().is_empty


def test_identities_parse_reports_every_invalid_field_at_once() -> None:
    with pytest.raises(InvalidIdentities) as excinfo:
        Identities.parse(phone="abc", email="not-an-email", external_id="  ")
    found = [(error.field, error.code) for error in excinfo.value.errors]
    assert found == [
        ("phone", "invalid_phone"),
        ("email", "invalid_email"),
        ("external_id", "invalid_external_id"),
    ]
    assert str(excinfo.value).count(";") == 2


def test_identities_parse_reports_only_the_bad_field() -> None:
    with pytest.raises(InvalidIdentities) as excinfo:
        Identities.parse(phone="+5511987654321", email="ana@")
    assert [error.field for error in excinfo.value.errors] == ["email"]


def test_identities_are_immutable() -> None:
    identities = Identities(phone="+5511987654321")
    with pytest.raises(AttributeError):
        identities.phone = "+551134567890"  # type: ignore[misc]


def test_identity_errors_survive_pickling_between_processes() -> None:
    error = InvalidIdentity(field="phone", code="invalid_phone", message="phone number is empty")
    group = pickle.loads(pickle.dumps(InvalidIdentities((error,))))
    assert isinstance(group, InvalidIdentities)
    assert [(e.field, e.code, e.message) for e in group.errors] == [
        ("phone", "invalid_phone", "phone number is empty")
    ]


def test_normalize_contact_fields_reports_every_bad_field_in_one_order() -> None:
    raw = {"name": "x" * 201, "external_id": "", "email": "a@b", "phone": "abc", "age": "3"}
    with pytest.raises(InvalidIdentities) as excinfo:
        normalize_contact_fields(raw)
    assert [e.field for e in excinfo.value.errors] == [
        "phone", "email", "external_id", "name", "age"
    ]  # fmt: skip
    clean = normalize_contact_fields({"name": " Ana ", "phone": "(11) 98765-4321", "email": None})
    assert clean == {"phone": "+5511987654321", "email": None, "name": "Ana"}


@pytest.mark.parametrize(
    ("field", "code", "values"),
    [
        ("email", "invalid_email", ["ana\ud800@loja.com.br", "\udfff@loja.com.br",
                                    "ana@loja\ud800.com.br", "ana@\udc00.com.br"]),
        ("phone", "invalid_phone", ["+55 11 98765\ud800-4321", "\ud800"]),
        ("external_id", "invalid_external_id", ["cliente-\ud800"]),
        ("name", "invalid_name", ["Ana \udfff"]),
    ],
)  # fmt: skip
def test_lone_surrogates_are_invalid_values_not_encoding_errors(
    field: str, code: str, values: list[str]
) -> None:
    for raw in values:
        with pytest.raises(InvalidIdentities) as excinfo:
            normalize_contact_fields({field: raw})
        assert [(e.field, e.code) for e in excinfo.value.errors] == [(field, code)], raw
    if field == "phone":
        with pytest.raises(InvalidIdentity):
            normalize_wa_id("5511\ud800987654321")
