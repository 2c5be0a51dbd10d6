"""Contact identities: phone (E.164), email and external ids, normalized without I/O.

A contact is matched by what a person or a provider tells us about it, in whatever shape
it arrives ("(11) 98765-4321", a WhatsApp ``wa_id`` such as ``551187654321``, "Ana@X.com").
A typed phone is read as Brazilian first (`normalize_phone`); a WhatsApp id is always
international digits (`normalize_wa_id`), so a Peruvian ``51987654321`` stays Peruvian.
Every function here turns one such value into the single canonical string stored and
compared, or raises an error naming the field and a machine-readable code:

```
ValueError
├── InvalidIdentity      # .field, .code, .message — one bad value
└── InvalidIdentities    # .errors — every bad value of one Identities.parse call
```
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import phonenumbers

from sinal.errors import FieldError, InvalidContact, SinalError

__all__ = [
    "Identities",
    "InvalidIdentities",
    "InvalidIdentity",
    "normalize_contact_fields",
    "normalize_email",
    "normalize_external_id",
    "normalize_name",
    "normalize_phone",
    "normalize_tag",
    "normalize_wa_id",
    "phone_variants",
]

BRAZIL_COUNTRY_CODE = 55
MAX_EXTERNAL_ID_LENGTH = 255
MAX_NAME_LENGTH = 200
MAX_EMAIL_LENGTH = 254  # RFC 5321 path limit (256) minus the angle brackets
MAX_EMAIL_LOCAL_LENGTH = 64
MAX_TAG = 64

# Long enough for any formatted number; short enough that junk is rejected before parsing.
_MAX_PHONE_INPUT_LENGTH = 64
# Separators people type between digits. Letters are refused: phonenumbers would read
# "0800-FLORES" as a vanity number, which a CRM contact never means.
_PHONE_SEPARATORS = frozenset(" \t-.()/")
_ASCII_DIGITS = frozenset("0123456789")
# 8-digit Brazilian subscriber numbers starting 6-9 were mobiles before the ninth digit
# was added (2012-2016); 2-5 are landlines and must never gain a 9.
_LEGACY_MOBILE_FIRST_DIGITS = frozenset("6789")

# RFC 5322 "atext" plus dots; quoted local parts and comments are not accepted.
_EMAIL_LOCAL_ASCII = re.compile(r"[a-z0-9!#$%&'*+/=?^_`{|}~.-]+")
_DOMAIN_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")

_Normalizer = Callable[[str], str]


class InvalidIdentity(SinalError, ValueError):
    """One identity value that cannot be normalized; ``code`` is stable, ``message`` human."""

    def __init__(self, field: str, code: str, message: str) -> None:
        # All three go to args so the exception survives pickling between processes.
        super().__init__(field, code, message)
        self.field = field
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidIdentities(SinalError, ValueError):
    """Several identity values were invalid; ``errors`` holds one error per bad field."""

    def __init__(self, errors: tuple[InvalidIdentity, ...]) -> None:
        super().__init__(errors)
        self.errors = errors

    def __str__(self) -> str:
        return "; ".join(str(error) for error in self.errors)


# --- phone -------------------------------------------------------------------------------


def normalize_phone(raw: str, default_region: str = "BR") -> str:
    """Return ``raw`` as canonical E.164, Brazilian mobiles always with the ninth digit."""
    if default_region not in phonenumbers.SUPPORTED_REGIONS:
        # A caller's mistake, not the user's: do not report it as a bad phone number.
        raise ValueError(f"unknown region {default_region!r}")
    text = _clean_phone_input(raw)
    number = _parse_phone(text, default_region)
    if number is None:
        raise _invalid_phone("is not valid; include the area code (DDD) or the country code")
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def normalize_wa_id(raw: str) -> str:
    """Return a WhatsApp id (international digits, no "+") as canonical E.164.

    Meta's ``wa_id``, ``from`` and ``recipient_id`` always carry the country code, so they
    are never read as a Brazilian national number: "51987654321" is Peru's +51 987 654 321,
    not Porto Alegre's (51) 98765-4321. Brazilian mobiles still gain the ninth digit.
    """
    text = _clean_phone_input(raw)
    digits = "".join(char for char in text if char in _ASCII_DIGITS)
    number = _parse_valid("+" + digits, "BR")  # the region is unused: the number has "+"
    if number is None:
        raise _invalid_phone("is not a valid WhatsApp id (international digits)")
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def phone_variants(e164: str) -> tuple[str, ...]:
    """Return the canonical number and, for a Brazilian mobile, its form without the 9."""
    canonical = normalize_phone(e164)
    national = canonical[3:]
    is_br_mobile = (
        canonical.startswith("+55")
        and len(national) == 11
        and national[2] == "9"
        and national[3] in _LEGACY_MOBILE_FIRST_DIGITS
    )
    if not is_br_mobile:
        return (canonical,)
    return (canonical, f"+55{national[:2]}{national[3:]}")


def _clean_phone_input(raw: str) -> str:
    """Check the characters of a raw phone number; return it NFKC-normalized and stripped."""
    # NFKC turns full-width digits and no-break spaces from copy-paste into plain ASCII.
    text = _visible_separators(unicodedata.normalize("NFKC", raw)).strip()
    if not text:
        raise _invalid_phone("is empty")
    if len(text) > _MAX_PHONE_INPUT_LENGTH:
        raise _invalid_phone(f"is longer than {_MAX_PHONE_INPUT_LENGTH} characters")
    body = text[1:] if text.startswith("+") else text
    if any(char not in _ASCII_DIGITS and char not in _PHONE_SEPARATORS for char in body):
        # "digits 0-9": "٠١١…" are digits too, and the message said only "digits"
        raise _invalid_phone("may contain only digits 0-9, spaces, '-', '.', '/', '(' and ')'")
    if not any(char in _ASCII_DIGITS for char in body):
        raise _invalid_phone("has no digits")
    return text


def _visible_separators(text: str) -> str:
    """`text` without invisible format characters (the bidi marks WhatsApp's apps put
    around a number copied from them, a zero-width space) and with any dash (‐ ‑ – —, as
    word processors write them) as '-': none changes a number's digits, and each made a
    pasted number "may contain only digits"."""
    if text.isascii():
        return text
    kept = (ch for ch in text if unicodedata.category(ch) != "Cf")
    return "".join("-" if unicodedata.category(ch) == "Pd" else ch for ch in kept)


def _parse_phone(text: str, default_region: str) -> phonenumbers.PhoneNumber | None:
    """Read a cleaned number as international or national; None if no reading is valid."""
    if text.startswith("+"):
        return _parse_valid(text, default_region)
    digits = "".join(char for char in text if char in _ASCII_DIGITS)
    if len(digits) in (12, 13) and digits.startswith("55"):
        # Typed with the country code but no "+": Brazilian national numbers have at most 11
        # digits (12 with the trunk 0), so 12-13 digits starting with 55 carry it.
        return _parse_valid("+" + digits, default_region)
    # The national reading wins: "4733221100" is a Joinville landline (DDD 47) for a
    # Brazilian account even though "+47 33221100" would also be a valid Norwegian number.
    national = _parse_valid(text, default_region)
    if national is not None:
        return national
    # Otherwise digits carrying their own country code ("16502530000" typed without "+").
    return _parse_valid("+" + digits, default_region)


def _parse_valid(text: str, default_region: str) -> phonenumbers.PhoneNumber | None:
    """Parse with phonenumbers, add a missing Brazilian ninth digit, and keep only valid."""
    try:
        number = phonenumbers.parse(text, default_region)
    except phonenumbers.NumberParseException:
        return None
    number = _with_ninth_digit(number)
    return number if phonenumbers.is_valid_number(number) else None


def _with_ninth_digit(number: phonenumbers.PhoneNumber) -> phonenumbers.PhoneNumber:
    """Insert the 9 after the DDD of a Brazilian mobile reported in the 8-digit form."""
    if number.country_code != BRAZIL_COUNTRY_CODE:
        return number
    national = phonenumbers.national_significant_number(number)
    is_legacy_mobile = (
        len(national) == 10
        and 11 <= int(national[:2]) <= 99
        and national[2] in _LEGACY_MOBILE_FIRST_DIGITS
    )
    if not is_legacy_mobile:
        return number
    fixed = f"{national[:2]}9{national[2:]}"
    return phonenumbers.PhoneNumber(country_code=BRAZIL_COUNTRY_CODE, national_number=int(fixed))


def _invalid_phone(reason: str) -> InvalidIdentity:
    """Build the error a user gets for a phone number; the raw value is not echoed (PII)."""
    return InvalidIdentity(field="phone", code="invalid_phone", message=f"phone number {reason}")


# --- email -------------------------------------------------------------------------------


def normalize_email(raw: str) -> str:
    """Return ``raw`` stripped, lowercased, with an IDNA-encoded domain; shape-checked only.

    The whole address is lowercased although RFC 5321 lets the local part be
    case-sensitive: no mainstream provider treats it so, and the CRM matches contacts by
    email, so "Ana@Loja.com" and "ana@loja.com" must be one contact. Full-width and
    half-width forms (what an East Asian keyboard types: "ａｎａ＠ｅｘａｍｐｌｅ.com") are
    read as the usual characters, and the result is in NFC, as RFC 8265 prepares a user
    name; a local part with any other compatibility character (a ligature "ﬁ", a
    superscript "²", "µ") is refused, not mapped: it prints as a plain address it is not,
    and mapping it could merge two mailboxes. Non-ASCII local parts are kept (RFC 6531).
    Non-ASCII domains use the stdlib "idna" codec (IDNA 2003: NFKC, and "ß" as "ss").
    No DNS is consulted.
    """
    text = unicodedata.normalize("NFC", _narrowed(raw).strip().lower())
    if not text:
        raise _invalid_email("is empty")
    if text.count("@") != 1:
        raise _invalid_email("must contain exactly one '@'")
    local, domain = text.split("@")
    _check_email_local(local)
    ascii_domain = _encode_domain(domain)
    address = f"{local}@{ascii_domain}"
    if len(address.encode("utf-8")) > MAX_EMAIL_LENGTH:
        raise _invalid_email(f"is longer than {MAX_EMAIL_LENGTH} bytes")
    return address


def _check_email_local(local: str) -> None:
    """Reject a local part that is empty, too long, or not a plain dot-atom."""
    if not local:
        raise _invalid_email("has nothing before the '@'")
    # Non-ASCII letters are allowed (RFC 6531); the ASCII rule applies to the rest. Checked
    # before the length in bytes: a lone surrogate has no UTF-8 encoding to measure.
    ascii_chars = "".join(char for char in local if char.isascii())
    has_bad_ascii = bool(ascii_chars) and not _EMAIL_LOCAL_ASCII.fullmatch(ascii_chars)
    has_bad_unicode = any(not char.isascii() and not char.isalnum() for char in local)
    if has_bad_ascii or has_bad_unicode:
        raise _invalid_email("has characters not allowed before the '@'")
    if not local.isascii() and unicodedata.normalize("NFKC", local) != local:
        raise _invalid_email(
            "has a compatibility character before the '@' (a ligature such as 'ﬁ', a "
            "superscript, the micro sign 'µ'); type it as plain letters and digits"
        )
    if len(local.encode("utf-8")) > MAX_EMAIL_LOCAL_LENGTH:
        raise _invalid_email(f"has more than {MAX_EMAIL_LOCAL_LENGTH} bytes before the '@'")
    if local.startswith(".") or local.endswith(".") or ".." in local:
        raise _invalid_email("cannot start or end with '.' or repeat '.' before the '@'")


def _narrowed(text: str) -> str:
    """`text` with its full-width and half-width forms as their usual characters ("ａ" as
    "a", "＠" as "@", "ｶ" as "カ"): RFC 8264's width mapping, no other compatibility one."""
    if text.isascii():
        return text
    return "".join(
        unicodedata.normalize("NFKC", char)
        if unicodedata.decomposition(char).startswith(("<wide>", "<narrow>"))
        else char
        for char in text
    )


def _encode_domain(domain: str) -> str:
    """Return the domain in ASCII (punycode for non-ASCII labels) after checking its labels."""
    if "." not in domain:
        raise _invalid_email("needs a domain with a dot after the '@'")
    try:
        ascii_domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        raise _invalid_email("has an invalid domain") from None
    labels = ascii_domain.split(".")
    if any(not _DOMAIN_LABEL.fullmatch(label) for label in labels):
        raise _invalid_email("has an invalid domain")
    if labels[-1].isdigit():
        # "user@10.0.0.1" is an unbracketed IP address, not a deliverable domain.
        raise _invalid_email("has an invalid domain")
    return ascii_domain


def _invalid_email(reason: str) -> InvalidIdentity:
    """Build the error a user gets for an email address; the raw value is not echoed."""
    return InvalidIdentity(field="email", code="invalid_email", message=f"email address {reason}")


# --- external id and name ----------------------------------------------------------------


def normalize_external_id(raw: str) -> str:
    """Return ``raw`` stripped and in NFC; it must be 1-255 characters with no control
    characters. NFC, as metric names and tags: "José" sent decomposed (e + U+0301) is the
    id "José", not a second contact that prints as the first. No compatibility mapping
    (NFKC) and no case folding: an id is the source's, and "Nº1" and "No1" may be two."""
    text = unicodedata.normalize("NFC", raw.strip())
    if not text:
        raise _invalid_external_id("is empty")
    if len(text) > MAX_EXTERNAL_ID_LENGTH:
        raise _invalid_external_id(f"is longer than {MAX_EXTERNAL_ID_LENGTH} characters")
    # Format characters (zero-width space, bidi marks) are refused too: they would make
    # two ids that print identically compare different.
    if _has_control_chars(text, categories=("Cc", "Cs", "Cf")):
        raise _invalid_external_id("contains control or invisible characters")
    return text


def normalize_name(raw: str | None) -> str | None:
    """Return a display name trimmed, with whitespace runs collapsed; None if blank."""
    if raw is None:
        return None
    # Tabs and newlines count as whitespace and are collapsed, not rejected.
    text = " ".join(unicodedata.normalize("NFC", raw).split())
    if not text:
        return None
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidIdentity(
            field="name",
            code="too_long",
            message=f"name is longer than {MAX_NAME_LENGTH} characters",
        )
    # Format characters stay allowed: zero-width joiners belong to emoji people put in names.
    if _has_control_chars(text, categories=("Cc", "Cs")):
        raise InvalidIdentity(
            field="name", code="invalid_name", message="name contains control characters"
        )
    return text


def _has_control_chars(text: str, categories: tuple[str, ...]) -> bool:
    """Tell whether any character of ``text`` is in one of the Unicode ``categories``."""
    return any(unicodedata.category(char) in categories for char in text)


def _invalid_external_id(reason: str) -> InvalidIdentity:
    """Build the error a user gets for an external id."""
    return InvalidIdentity(
        field="external_id", code="invalid_external_id", message=f"external id {reason}"
    )


# --- a contact's fields together --------------------------------------------------------


_FIELD_NORMALIZERS: dict[str, Callable[[str], str | None]] = {
    "phone": normalize_phone,
    "email": normalize_email,
    "external_id": normalize_external_id,
    "name": normalize_name,
}


def normalize_contact_fields(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Normalize each of a contact's fields given (phone, email, external_id, name; None
    stays None); raise `InvalidIdentities` naming every bad or unknown field at once."""
    errors: list[InvalidIdentity] = []
    clean: dict[str, str | None] = {}
    # In one fixed order, so the answer does not depend on how the caller built `values`.
    known = [name for name in _FIELD_NORMALIZERS if name in values]
    for name in known + sorted(set(values) - set(_FIELD_NORMALIZERS)):
        normalize, raw = _FIELD_NORMALIZERS.get(name), values[name]
        if normalize is None:
            errors.append(InvalidIdentity(name, "unknown_field", f"{name} is not a contact field"))
            continue
        if raw is not None and not isinstance(raw, str):
            # a phone as a number (11987654321) read from a spreadsheet: a TypeError from
            # deep in unicodedata named no field
            errors.append(InvalidIdentity(name, "invalid_type", f"{name} must be a string"))
            continue
        try:
            clean[name] = None if raw is None else normalize(raw)
        except InvalidIdentity as error:
            errors.append(error)
    if errors:
        raise InvalidIdentities(tuple(errors))
    return clean


# --- identities --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identities:
    """The normalized ways to recognise one contact; build it with ``Identities.parse``."""

    phone: str | None = None
    email: str | None = None
    external_id: str | None = None

    @classmethod
    def parse(
        cls,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
    ) -> Identities:
        """Normalize each value given (None means absent); raise every error at once."""
        errors: list[InvalidIdentity] = []

        def attempt(raw: str | None, normalize: _Normalizer) -> str | None:
            if raw is None:
                return None
            try:
                return normalize(raw)
            except InvalidIdentity as error:
                errors.append(error)
                return None

        parsed = cls(
            phone=attempt(phone, normalize_phone),
            email=attempt(email, normalize_email),
            external_id=attempt(external_id, normalize_external_id),
        )
        if errors:
            raise InvalidIdentities(tuple(errors))
        return parsed

    @property
    def is_empty(self) -> bool:
        """Tell whether no identity is known, so the contact cannot be matched."""
        return self.phone is None and self.email is None and self.external_id is None


def normalize_tag(raw: object, field: str = "tag") -> str:
    """A tag as stored: trimmed, inner spaces collapsed, NFC, 1-64 characters, no control
    characters; `InvalidContact` naming `field` otherwise. The API's tags and the
    automations' tag steps and filters all go through it, so one tag is one spelling."""
    if not isinstance(raw, str):
        raise InvalidContact([FieldError(field, "invalid_type", "a tag must be a string")])
    text = " ".join(unicodedata.normalize("NFC", raw).split())
    problem = None
    if not text:
        problem = ("empty", "a tag must not be empty")
    elif len(text) > MAX_TAG:
        problem = ("too_long", f"a tag is at most {MAX_TAG} characters")
    elif any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        problem = ("control_characters", "a tag must not contain control characters")
    if problem is not None:
        raise InvalidContact([FieldError(field, *problem)])
    return text
