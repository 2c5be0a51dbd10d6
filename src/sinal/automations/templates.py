"""Message templates: the event's and the contact's fields inside automation texts.

A small, safe syntax — no code runs, only dictionary and list lookups:

```text
Olá {{ contact.name | first_name | default:"cliente" }}, seu pedido
{{ event.properties.order_number }} de {{ event.value | money }} foi pago!
```

- `{{ path }}` is replaced by the value at `path`. Paths start at `event` or `contact`
  and go down with `.key` and `[index]`: `event.properties.items[0].sku`. Keys may hold
  any character except whitespace, `.`, `[`, `]`, `{`, `}`, `|`, `:` and quotes;
  indexes are whole numbers from 0.
- What a path can reach: `event.` `id`, `metric_name`, `value`, `currency`, `source`,
  `occurred_at`, `properties.…`; `contact.` `id`, `name`, `email`, `phone`, `tags`
  (`attributes.…` once contacts hold custom attributes).
- A missing path (or JSON `null`) renders as an empty string — a message never fails
  because an order lacks a field. Use `default` to say something instead.
- Filters, applied left to right after `|`:

  | filter | gives |
  |---|---|
  | `money` | Brazilian format, event's currency: `R$ 1.297,90`, `US$ 10,00`, `EUR 10,00` |
  | `money:"USD"` | the same in the named currency |
  | `upper` / `lower` | the text in upper / lower case |
  | `first_name` | the first word with a letter, minus marks around it: `🌸 *Ana* Lima` → `Ana` |
  | `default:"cliente"` | `cliente` when the value is missing, empty, spaces, `[]` or `{}` |

  `money` shows the currency's ISO 4217 decimal places: `JPY 1.235`, `KWD 1.234,568`.

- A literal `{{` is written `{{ "{{" }}`; any other text (including a lone `}}`) is
  copied as is. `{{ "text" }}` outputs the quoted text; quotes may be `"` or `'`, and
  `\\"` / `\\\\` escape inside them.
- Numbers print in full (`297.9`, never `2.979E+2`), `true`/`false` for booleans, lists and
  objects as compact JSON.

Templates are checked when an automation is saved (`parse_template` raises
`TemplateSyntaxError` with the position of the problem, and `check_fields` for a path
naming a field that is not listed above) and rendered when a step runs
(`render` never raises). Paths use the same syntax in automation filters
(`properties.items[0].sku`), parsed by `parse_path`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from enum import Enum
from functools import lru_cache
from typing import Final, Literal, TypeAlias
from uuid import UUID

from sinal.currencies import minor_units
from sinal.errors import SinalError
from sinal.events import decimal_from_text

__all__ = [
    "MISSING",
    "TEMPLATE_FIELDS",
    "TEMPLATE_ROOTS",
    "Expression",
    "FilterCall",
    "Missing",
    "Path",
    "Template",
    "TemplateSyntaxError",
    "check_fields",
    "format_money",
    "lookup",
    "parse_path",
    "parse_template",
    "render",
    "render_text",
    "render_value",
    "to_decimal",
]

Path: TypeAlias = tuple[str | int, ...]
"""A parsed path: keys (str) and list indexes (int), from the root."""

TEMPLATE_ROOTS: Final[frozenset[str]] = frozenset({"event", "contact"})
"""The names a template path may start with."""

TEMPLATE_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "event": ("id", "metric_name", "value", "currency", "source", "occurred_at", "properties"),
    "contact": ("id", "name", "email", "phone", "tags"),
}
"""The fields under each root that a step's context holds (`matching.template_context`);
`contact.attributes` too, but contacts have none yet, so a path into it would render empty
(and a filter on it is refused alike)."""

FilterName = Literal["money", "upper", "lower", "first_name", "default"]
SyntaxCode = Literal[
    "unterminated_tag",
    "empty_tag",
    "invalid_path",
    "unknown_variable",
    "unknown_filter",
    "missing_argument",
    "unexpected_argument",
    "invalid_argument",
    "unterminated_string",
    "unexpected_character",
]

MAX_PATH_DEPTH: Final = 16
MAX_INDEX_DIGITS: Final = 6
# Amounts beyond this many integer digits are not money any platform sends: format_money
# refuses them (ValueError) rather than format with a huge decimal context, and `| money`
# renders them as missing.
_MAX_MONEY_DIGITS: Final = 30
_SYMBOLS: Final[Mapping[str, str]] = {"BRL": "R$", "USD": "US$"}
_KEY_CHAR: Final = re.compile(r"""[^\s.\[\]{}|:"']""")
_FILTER_NAME: Final = re.compile(r"[A-Za-z0-9_]+")
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


class Missing(Enum):
    """The type of `MISSING`: what a lookup finds where nothing is."""

    MISSING = "missing"


MISSING: Final = Missing.MISSING
"""Returned by `lookup` for a path that leads nowhere."""


class TemplateSyntaxError(SinalError, ValueError):
    """A template or path cannot be parsed; `.position` is the 0-based offset."""

    def __init__(self, code: SyntaxCode, message: str, text: str, position: int) -> None:
        self.code: SyntaxCode = code
        self.position = position
        self.line = text.count("\n", 0, position) + 1
        self.column = position - (text.rfind("\n", 0, position) + 1) + 1
        self.detail = message
        super().__init__(f"{message} (position {position}, line {self.line}, column {self.column})")


@dataclass(frozen=True, slots=True)
class FilterCall:
    """One `| name` or `| name:"argument"` in a tag."""

    name: FilterName
    argument: str | None = None


@dataclass(frozen=True, slots=True)
class Expression:
    """One `{{ … }}` tag: a path (or a quoted literal) and its filters."""

    path: Path | None
    literal: str | None
    filters: tuple[FilterCall, ...]
    position: int


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text and expressions, in order."""

    source: str
    parts: tuple[str | Expression, ...]

    @property
    def paths(self) -> tuple[Path, ...]:
        """The paths the template reads, in order."""
        return tuple(p.path for p in self.parts if isinstance(p, Expression) and p.path)


# --------------------------------------------------------------------------- parsing


class _Scanner:
    """A cursor over the text of one template or path."""

    def __init__(self, text: str, pos: int = 0) -> None:
        self.text = text
        self.pos = pos

    def fail(self, code: SyntaxCode, message: str, pos: int | None = None) -> TemplateSyntaxError:
        return TemplateSyntaxError(code, message, self.text, self.pos if pos is None else pos)

    def peek(self, size: int = 1) -> str:
        return self.text[self.pos : self.pos + size]

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def read_key(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and _KEY_CHAR.match(self.text[self.pos]):
            self.pos += 1
        return self.text[start : self.pos]

    def read_path(self) -> Path:
        start = self.pos
        first = self.read_key()
        if not first:
            raise self.fail("invalid_path", "expected a name")
        path: list[str | int] = [first]
        while self.peek() in (".", "["):
            if self.peek() == ".":
                self.pos += 1
                key = self.read_key()
                if not key:
                    raise self.fail("invalid_path", "expected a key after '.'")
                path.append(key)
            else:
                path.append(self.read_index())
            if len(path) > MAX_PATH_DEPTH:
                raise self.fail("invalid_path", f"paths go at most {MAX_PATH_DEPTH} deep", start)
        return tuple(path)

    def read_index(self) -> int:
        self.pos += 1  # '['
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        digits = self.text[start : self.pos]
        if not digits or len(digits) > MAX_INDEX_DIGITS or self.peek() != "]":
            raise self.fail("invalid_path", "expected a list index like [0]", start - 1)
        self.pos += 1
        return int(digits)

    def read_string(self) -> str:
        quote, start = self.peek(), self.pos
        self.pos += 1
        chars: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == quote:
                self.pos += 1
                return "".join(chars)
            if char == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
                char = self.text[self.pos]
            chars.append(char)
            self.pos += 1
        raise self.fail("unterminated_string", "this quoted text is never closed", start)


def parse_path(text: str) -> Path:
    """Parse a dot path like `properties.items[0].sku`; raise `TemplateSyntaxError`."""
    scanner = _Scanner(text)
    path = scanner.read_path()
    if scanner.pos != len(text):
        raise scanner.fail("invalid_path", f"unexpected {text[scanner.pos]!r} in the path")
    return path


def parse_template(text: str, roots: Collection[str] = TEMPLATE_ROOTS) -> Template:
    """Parse a template, checking paths start at one of `roots`; raise on bad syntax."""
    scanner = _Scanner(text)
    parts: list[str | Expression] = []
    while True:
        start = text.find("{{", scanner.pos)
        if start < 0:
            break
        if start > scanner.pos:
            parts.append(text[scanner.pos : start])
        scanner.pos = start + 2
        parts.append(_read_tag(scanner, start, roots))
    if scanner.pos < len(text):
        parts.append(text[scanner.pos :])
    return Template(text, tuple(parts))


def check_fields(template: Template) -> None:
    """Refuse a path naming a field its root does not have (`{{ event.total }}` for
    `event.properties.total`): it would render empty in every message."""
    for part in template.parts:
        if not isinstance(part, Expression) or part.path is None or len(part.path) < 2:
            continue
        root, name = part.path[0], part.path[1]
        known = TEMPLATE_FIELDS.get(str(root))
        if known is not None and name not in known:
            raise TemplateSyntaxError(
                "unknown_variable",
                f"{root} has no field {name!r}: use {', '.join(known)}"
                + (" (the payload's fields are under properties)" if root == "event" else ""),
                template.source,
                part.position,
            )


def _read_tag(scanner: _Scanner, start: int, roots: Collection[str]) -> Expression:
    scanner.skip_spaces()
    if scanner.pos >= len(scanner.text):
        raise scanner.fail("unterminated_tag", "'{{' is never closed by '}}'", start)
    if scanner.peek(2) == "}}":
        raise scanner.fail("empty_tag", "'{{ }}' names nothing", start)
    path: Path | None = None
    literal: str | None = None
    if scanner.peek() in ("'", '"'):
        literal = scanner.read_string()
    else:
        path_at = scanner.pos
        path = scanner.read_path()
        if path[0] not in roots:
            names = " or ".join(repr(r) for r in sorted(roots))
            raise scanner.fail(
                "unknown_variable", f"unknown variable {path[0]!r}: start with {names}", path_at
            )
    filters = _read_filters(scanner, start)
    return Expression(path, literal, filters, start)


def _read_filters(scanner: _Scanner, start: int) -> tuple[FilterCall, ...]:
    filters: list[FilterCall] = []
    while True:
        scanner.skip_spaces()
        if scanner.pos >= len(scanner.text):
            raise scanner.fail("unterminated_tag", "'{{' is never closed by '}}'", start)
        if scanner.peek(2) == "}}":
            scanner.pos += 2
            return tuple(filters)
        if scanner.peek() != "|":
            char = scanner.peek()
            raise scanner.fail(
                "unexpected_character", f"unexpected {char!r}; expected '|' or '}}}}'"
            )
        scanner.pos += 1
        scanner.skip_spaces()
        filters.append(_read_filter(scanner))


def _read_filter(scanner: _Scanner) -> FilterCall:
    name_at = scanner.pos
    match = _FILTER_NAME.match(scanner.text, scanner.pos)
    name = match.group() if match else ""
    scanner.pos += len(name)
    if name not in _FILTERS:
        known = ", ".join(sorted(_FILTERS))
        shown = repr(name) if name else "nothing"
        raise scanner.fail("unknown_filter", f"unknown filter {shown} (known: {known})", name_at)
    argument: str | None = None
    if scanner.peek() == ":":
        scanner.pos += 1
        if scanner.peek() not in ("'", '"'):
            raise scanner.fail("invalid_argument", f"{name}'s argument must be quoted text")
        arg_at = scanner.pos
        argument = scanner.read_string()
        if name == "money" and not _CURRENCY.fullmatch(argument):
            raise scanner.fail("invalid_argument", 'money takes a currency code like "USD"', arg_at)
    if name == "default" and argument is None:
        raise scanner.fail("missing_argument", 'default needs a text: default:"cliente"', name_at)
    if argument is not None and name not in ("default", "money"):
        raise scanner.fail("unexpected_argument", f"{name} takes no argument", name_at)
    return FilterCall(name, argument)  # type: ignore[arg-type]  # checked against _FILTERS


# --------------------------------------------------------------------------- rendering


def lookup(root: object, path: Sequence[str | int]) -> object:
    """Follow `path` through mappings and lists; `MISSING` where it leads nowhere."""
    node = root
    for step in path:
        if isinstance(step, str) and isinstance(node, Mapping):
            if step not in node:
                return MISSING
            node = node[step]
        elif isinstance(step, int) and isinstance(node, list | tuple):
            if step >= len(node):
                return MISSING
            node = node[step]
        else:
            return MISSING
    return node


def render(template: Template, context: Mapping[str, object]) -> str:
    """Render a parsed template with `context` (`{"event": …, "contact": …}`); never raises."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value: object = part.literal if part.path is None else lookup(context, part.path)
        for call in part.filters:
            value = _FILTERS[call.name](value, call.argument, context)
        out.append(_to_text(value))
    return "".join(out)


@lru_cache(maxsize=1024)
def _cached_template(text: str) -> Template:
    return parse_template(text)


def render_text(text: str, context: Mapping[str, object]) -> str:
    """Parse (cached) and render a template text checked when its automation was saved."""
    return render(_cached_template(text), context)


def render_value(value: object, context: Mapping[str, object]) -> object:
    """Render every string inside JSON-like data (a send_template's components)."""
    if isinstance(value, str):
        return render_text(value, context)
    if isinstance(value, Mapping):
        return {key: render_value(item, context) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [render_value(item, context) for item in value]
    return value


def format_money(amount: Decimal, currency: str = "BRL") -> str:
    """Format an amount the Brazilian way: `R$ 1.297,90`, `US$ 10,00`, `EUR 10,00`, with
    the currency's ISO 4217 decimal places (`JPY 1.235`, `KWD 1.234,568`). Raises
    `ValueError` for an amount that is not finite or has more than 30 integer digits."""
    if not amount.is_finite() or (amount and amount.adjusted() >= _MAX_MONEY_DIGITS):
        raise ValueError(f"money is finite, with at most {_MAX_MONEY_DIGITS} integer digits")
    code = currency.upper()
    places = minor_units(code)
    with localcontext() as ctx:
        ctx.prec = _MAX_MONEY_DIGITS + 10  # every digit of the rounded amount
        rounded = amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    sign = "-" if rounded < 0 else ""
    # copy_abs, not abs(): abs() rounds to the caller's context (28 digits by default).
    whole, _, fraction = f"{rounded.copy_abs():f}".partition(".")
    grouped = f"{int(whole):,}".replace(",", ".")
    number = f"{grouped},{fraction}" if places else grouped
    return f"{sign}{_SYMBOLS.get(code, code)} {number}"


_Filter = Callable[[object, str | None, Mapping[str, object]], object]


def _is_blank(value: object) -> bool:
    """Missing, null, only whitespace, or an empty list or object: what `default` replaces."""
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, Mapping | list | tuple):
        return not value
    return value is MISSING or value is None


def _money(value: object, argument: str | None, context: Mapping[str, object]) -> object:
    amount = to_decimal(value)
    if amount is None:
        return MISSING
    currency = argument or lookup(context, ("event", "currency"))
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency.upper()):
        currency = "BRL"
    try:
        return format_money(amount, currency)
    except ValueError:  # beyond any real amount
        return MISSING


def _upper(value: object, _argument: str | None, _context: Mapping[str, object]) -> object:
    return value if _is_blank(value) else _to_text(value).upper()


def _lower(value: object, _argument: str | None, _context: Mapping[str, object]) -> object:
    return value if _is_blank(value) else _to_text(value).lower()


def _first_name(value: object, _argument: str | None, _context: Mapping[str, object]) -> object:
    # WhatsApp profile names carry emoji and format marks ("🌸 Ana", "*Maria*"): the first
    # word with a letter, from its first letter to its last (and that letter's accents).
    for word in _to_text(value).split():
        letters = [i for i, char in enumerate(word) if char.isalpha()]
        if letters:
            end = letters[-1] + 1
            while end < len(word) and _is_accent(word[end]):
                end += 1
            return word[letters[0] : end]
    return MISSING


def _is_accent(char: str) -> bool:
    """A combining mark (the ◌́ of a decomposed "José"), not an emoji's variation selector."""
    variation = "\ufe00" <= char <= "\ufe0f" or "\U000e0100" <= char <= "\U000e01ef"
    return unicodedata.category(char) in ("Mn", "Mc") and not variation


def _default(value: object, argument: str | None, _context: Mapping[str, object]) -> object:
    return argument if _is_blank(value) else value


_FILTERS: Final[Mapping[str, _Filter]] = {
    "money": _money,
    "upper": _upper,
    "lower": _lower,
    "first_name": _first_name,
    "default": _default,
}


def to_decimal(value: object) -> Decimal | None:
    """A finite Decimal from a number or numeric text written as a JSON number ("297.90",
    not " 5 " or "1_000": `sinal.events.decimal_from_text`); None for anything else."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, Decimal):
            number = value
        elif isinstance(value, int):
            number = Decimal(value)
        elif isinstance(value, float):
            number = Decimal(repr(value))  # 297.9 stays 297.9, not 297.899999…
        elif isinstance(value, str) and (found := decimal_from_text(value)) is not None:
            number = found
        else:
            return None
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def _to_text(value: object) -> str:
    """The text a value renders as; empty for missing values and what cannot be shown."""
    if value is MISSING or value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        number = to_decimal(value)
        if number is None:
            return ""
        # Plain digits for any amount a person reads; exponent form for absurd magnitudes.
        return f"{number:f}" if abs(number.adjusted()) <= 100 else _exponent_text(number)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    # A context is data from outside: a message is better sent without one odd value
    # (circular, or an int too long for str()) than not sent at all.
    except (TypeError, ValueError, RecursionError):
        return ""


def _exponent_text(number: Decimal) -> str:
    """`number` in exponent form without trailing zeros (`1E+200`), exact at any exponent:
    normalize() would round to the context, and signal Overflow past its limits."""
    sign, digits, exponent = number.as_tuple()
    kept = len(digits)
    while kept > 1 and digits[kept - 1] == 0:
        kept -= 1
    if digits[:kept] == (0,):
        return "-0" if sign else "0"
    return str(Decimal((sign, digits[:kept], int(exponent) + len(digits) - kept)))
