"""Message templates: the syntax, what renders, pt-BR money, and the errors people see."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.automations.templates import (
    MISSING,
    Expression,
    FilterCall,
    Template,
    TemplateSyntaxError,
    format_money,
    lookup,
    parse_path,
    parse_template,
    render,
    render_text,
    render_value,
)
from sinal.errors import SinalError

CONTEXT: dict[str, Any] = {
    "event": {
        "id": UUID(int=7),
        "metric_name": "Order Paid",
        "value": Decimal("1297.9"),
        "currency": "BRL",
        "source": "shopify",
        "occurred_at": datetime(2026, 11, 29, 13, 0, tzinfo=UTC),
        "properties": {
            "order_number": "#1001",
            "total": "297.90",
            "items": [{"sku": "CAMISA-P", "qty": 2, "price": 149.45}],
            "gift": True,
            "coupon": None,
            "empty": "",
            "nested": {"a": [1, {"b": "c"}]},
            "carrier": "Correios",
        },
    },
    "contact": {
        "name": "maria da silva",
        "email": "maria@example.com",
        "tags": ["vip", "newsletter"],
        "attributes": {"cidade": "São Paulo"},
    },
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Olá!", "Olá!"),
        ("", ""),
        ("{{contact.name}}", "maria da silva"),
        ("{{ contact.name }}", "maria da silva"),
        ("{{\tcontact.name\n}}", "maria da silva"),
        ("Olá {{ contact.name | first_name }}", "Olá maria"),
        ("{{ contact.name | upper }}", "MARIA DA SILVA"),
        ("{{ contact.name | first_name | upper }}", "MARIA"),
        ("{{ event.properties.carrier | lower }}", "correios"),
        ("{{ event.properties.order_number }}", "#1001"),
        ("{{ event.properties.items[0].sku }}", "CAMISA-P"),
        ("{{ event.properties.items[0].qty }}", "2"),
        ("{{ event.properties.items[0].price }}", "149.45"),
        ("{{ event.properties.nested.a[1].b }}", "c"),
        ("{{ event.properties.nested }}", '{"a":[1,{"b":"c"}]}'),
        ("{{ contact.tags }}", '["vip","newsletter"]'),
        ("{{ contact.tags[1] }}", "newsletter"),
        ("{{ contact.attributes.cidade }}", "São Paulo"),
        ("{{ event.properties.gift }}", "true"),
        ("{{ event.value }}", "1297.9"),
        ("{{ event.id }}", "00000000-0000-0000-0000-000000000007"),
        ("{{ event.occurred_at }}", "2026-11-29T13:00:00+00:00"),
        # missing values render empty, or the default
        ("[{{ event.properties.tracking_code }}]", "[]"),
        ("[{{ event.properties.coupon }}]", "[]"),
        ("[{{ event.properties.items[3].sku }}]", "[]"),
        ("[{{ event.properties.order_number.x }}]", "[]"),
        ("[{{ contact.tags.first }}]", "[]"),
        ('{{ event.properties.coupon | default:"sem cupom" }}', "sem cupom"),
        ('{{ event.properties.empty | default:"vazio" }}', "vazio"),
        ("{{ event.properties.missing | default:'cliente' }}", "cliente"),
        ('{{ contact.name | default:"cliente" }}', "maria da silva"),
        ('{{ event.properties.missing | upper | default:"x" }}', "x"),
        ('{{ event.properties.empty | first_name | default:"x" }}', "x"),
        ('{{ event.properties.gift | default:"x" }}', "true"),
        # literals and escaping
        ('{{ "{{" }}1}}', "{{1}}"),
        ("}} {", "}} {"),
        ("{ {contact.name} }", "{ {contact.name} }"),
        ('{{ "a\\"b" }}', 'a"b'),
        ("{{ 'it\\'s' }}", "it's"),
        ("{{ 'a\\\\b' }}", "a\\b"),
        ('{{ "x" | upper }}', "X"),
        ('{{ event.properties.missing | default:"a}}b" }}', "a}}b"),
        # money: pt-BR format with the event's currency
        ("{{ event.value | money }}", "R$ 1.297,90"),
        ("{{ event.properties.total | money }}", "R$ 297,90"),
        ("{{ event.properties.items[0].price | money }}", "R$ 149,45"),
        ('{{ event.value | money:"USD" }}', "US$ 1.297,90"),
        ('{{ event.properties.order_number | money | default:"—" }}', "—"),
        ("[{{ event.properties.gift | money }}]", "[]"),
    ],
)
def test_render_text(text: str, expected: str) -> None:
    assert render_text(text, CONTEXT) == expected


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        ("297.90", "BRL", "R$ 297,90"),
        ("297.9", "BRL", "R$ 297,90"),
        ("0", "BRL", "R$ 0,00"),
        ("0.005", "BRL", "R$ 0,01"),  # half up, as a cashier rounds
        ("0.004", "BRL", "R$ 0,00"),
        ("-0.001", "BRL", "R$ 0,00"),  # no "-R$ 0,00"
        ("-10", "BRL", "-R$ 10,00"),
        ("1000", "BRL", "R$ 1.000,00"),
        ("1234567.891", "BRL", "R$ 1.234.567,89"),
        ("999.999", "BRL", "R$ 1.000,00"),
        ("1E+3", "BRL", "R$ 1.000,00"),
        ("10", "USD", "US$ 10,00"),
        ("10", "EUR", "EUR 10,00"),
        ("10", "eur", "EUR 10,00"),
        ("1234.5", "JPY", "JPY 1.235"),  # no minor unit
        ("99999999999999.9999", "BRL", "R$ 100.000.000.000.000,00"),
    ],
)
def test_format_money_brazilian_format(amount: str, currency: str, expected: str) -> None:
    assert format_money(Decimal(amount), currency) == expected


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        ("123456789012345678901234567.891", "R$ 123.456.789.012.345.678.901.234.567,89"),
        ("-123456789012345678901234567.891", "-R$ 123.456.789.012.345.678.901.234.567,89"),
        ("9" * 30 + ".995", "R$ 1" + ".000" * 10 + ",00"),  # 30 digits, rounded up to 31
        ("0E+100", "R$ 0,00"),
    ],
)
def test_format_money_keeps_every_digit_up_to_its_limit(amount: str, expected: str) -> None:
    assert format_money(Decimal(amount)) == expected
    assert render_text("{{ event.value | money }}", {"event": {"value": amount}}) == expected


@pytest.mark.parametrize("amount", ["1e30", "-1e30", "1e50", "1E+1000000", "NaN", "-Infinity"])
def test_format_money_refuses_amounts_beyond_its_limit(amount: str) -> None:
    with pytest.raises(ValueError, match="at most 30 integer digits"):
        format_money(Decimal(amount))
    assert render_text("[{{ event.value | money }}]", {"event": {"value": Decimal(amount)}}) == "[]"


@pytest.mark.parametrize(
    ("currency", "expected"),
    [
        # three decimal places (ISO 4217 minor unit 3)
        ("KWD", "KWD 1.234,568"),
        ("BHD", "BHD 1.234,568"),
        ("TND", "TND 1.234,568"),
        ("JOD", "JOD 1.234,568"),
        ("OMR", "OMR 1.234,568"),
        ("IQD", "IQD 1.234,568"),
        ("LYD", "LYD 1.234,568"),
        # none
        ("BIF", "BIF 1.235"),
        ("RWF", "RWF 1.235"),
        ("XPF", "XPF 1.235"),
        ("DJF", "DJF 1.235"),
        ("GNF", "GNF 1.235"),
        ("KMF", "KMF 1.235"),
        ("VUV", "VUV 1.235"),
        ("CLP", "CLP 1.235"),
        ("KRW", "KRW 1.235"),
        ("XOF", "XOF 1.235"),
        # four (Chile's Unidad de Fomento)
        ("CLF", "CLF 1.234,5678"),
        # two: the rest, and codes ISO 4217 gives none to
        ("EUR", "EUR 1.234,57"),
        ("MGA", "MGA 1.234,57"),
        ("XAU", "XAU 1.234,57"),
    ],
)
def test_format_money_uses_the_currency_minor_unit(currency: str, expected: str) -> None:
    assert format_money(Decimal("1234.5678"), currency) == expected
    event = {"value": Decimal("1234.5678"), "currency": currency}
    assert render_text("{{ event.value | money }}", {"event": event}) == expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"value": Decimal("10"), "currency": "USD"}, "US$ 10,00"),
        ({"value": Decimal("10"), "currency": "GBP"}, "GBP 10,00"),
        ({"value": 10}, "R$ 10,00"),  # no currency: BRL, sinal's default
        ({"value": 10, "currency": "nada"}, "R$ 10,00"),
        ({"value": 10, "currency": None}, "R$ 10,00"),
        ({"value": 0.1 + 0.2}, "R$ 0,30"),
        ({"value": "1.5e2"}, "R$ 150,00"),
        ({"value": float("nan")}, ""),
        ({"value": Decimal("Infinity")}, ""),
        ({"value": Decimal("1e40")}, ""),
        ({"value": "R$ 10"}, ""),
    ],
)
def test_render_money_uses_the_event_currency(event: dict[str, Any], expected: str) -> None:
    assert render_text("{{ event.value | money }}", {"event": event}) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-3, "-3"),
        (1e20, "100000000000000000000"),
        (2.5e-7, "0.00000025"),
        (Decimal("1E+2"), "100"),
        (Decimal("-0.0"), "-0.0"),
        (float("inf"), ""),
        (10**100, "1" + "0" * 100),
        (10**200, "1E+200"),
        (Decimal("1.5e-150"), "1.5E-150"),
        # beyond int's str() limit: shown, not raised
        pytest.param(10**5000, "1E+5000", id="int-beyond-str-limit"),
        # beyond the decimal context's exponents: shown exactly, not raised
        (Decimal("1E+1000000"), "1E+1000000"),
        (Decimal("-1.500E+1000000"), "-1.5E+1000000"),
        (Decimal("1E-1000000"), "1E-1000000"),
        (Decimal("0E+1000"), "0"),
        ([1, "a", None], '[1,"a",null]'),
        ({"a": Decimal("1.5")}, '{"a":"1.5"}'),
        ({"ç": "ã"}, '{"ç":"ã"}'),
    ],
)
def test_render_shows_values(value: object, expected: str) -> None:
    assert render_text("{{ event.x }}", {"event": {"x": value}}) == expected


def test_render_circular_data_renders_empty() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert render_text("[{{ event.x }}]", {"event": {"x": loop}}) == "[]"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Maria Silva", "Maria"),
        ("  Maria  ", "Maria"),
        ("MARIA", "MARIA"),
        ("José\tCarlos", "José"),
        ("   ", ""),
        (None, ""),
        # WhatsApp profile names: emoji and format marks are not the name
        ("🌸 Ana Paula", "Ana"),
        ("~ Maria ~", "Maria"),
        ("*Maria* Silva", "Maria"),
        ("_Maria_", "Maria"),
        ("❤️Ana❤️ Souza", "Ana"),
        ("👩‍💻 Bia", "Bia"),
        ('"Zé" Carlos', "Zé"),
        ("Jose\u0301 Silva", "Jose\u0301"),  # a decomposed José keeps its accent
        ("Bia\ufe0f", "Bia"),  # a stray variation selector is no accent
        ("D'Ávila", "D'Ávila"),
        ("Ana-Paula Souza", "Ana-Paula"),
        ("王伟", "王伟"),
        # no letter at all: empty, so default applies
        ("🌸🌸", ""),
        ("... ---", ""),
        (42, ""),
    ],
)
def test_render_first_name(value: object, expected: str) -> None:
    assert render_text("{{ contact.name | first_name }}", {"contact": {"name": value}}) == expected


@pytest.mark.parametrize(
    ("contact", "expected"),
    [
        ({"tags": []}, "sem tags"),
        ({"tags": ()}, "sem tags"),
        ({"tags": {}}, "sem tags"),
        ({"tags": "   "}, "sem tags"),
        ({"tags": "\t\n"}, "sem tags"),
        ({"tags": ["vip"]}, '["vip"]'),
        ({"tags": {"a": 1}}, '{"a":1}'),
        ({"tags": " vip "}, " vip "),
        ({"tags": 0}, "0"),
        ({"tags": False}, "false"),
    ],
)
def test_default_replaces_empty_lists_objects_and_blank_text(
    contact: dict[str, Any], expected: str
) -> None:
    text = '{{ contact.tags | default:"sem tags" }}'
    assert render_text(text, {"contact": contact}) == expected


@pytest.mark.parametrize("name", ["🌸", "*", "42", " ~ "])
def test_first_name_without_letters_takes_the_default(name: str) -> None:
    text = '{{ contact.name | first_name | default:"cliente" }}'
    assert render_text(text, {"contact": {"name": name}}) == "cliente"


@pytest.mark.parametrize(
    ("text", "code", "position"),
    [
        ("Olá {{ contact.name", "unterminated_tag", 4),
        ("Olá {{", "unterminated_tag", 4),
        ("{{ contact.name | upper", "unterminated_tag", 0),
        ("{{ }}", "empty_tag", 0),
        ("a {{}}", "empty_tag", 2),
        ("{{ name }}", "unknown_variable", 3),
        ("{{ pedido.numero }}", "unknown_variable", 3),
        ("{{ 1 }}", "unknown_variable", 3),
        ("{{ event. }}", "invalid_path", 9),
        ("{{ event..x }}", "invalid_path", 9),
        ("{{ event.items[] }}", "invalid_path", 14),
        ("{{ event.items[-1] }}", "invalid_path", 14),
        ("{{ event.items[a] }}", "invalid_path", 14),
        ("{{ event.items[0 }}", "invalid_path", 14),
        ("{{ event.items[1234567] }}", "invalid_path", 14),
        ("{{ .x }}", "invalid_path", 3),
        ("{{ event.value | mony }}", "unknown_filter", 17),
        ("{{ event.value | }}", "unknown_filter", 17),
        ("{{ event.value | Money }}", "unknown_filter", 17),
        ("{{ event.value | default }}", "missing_argument", 17),
        ("{{ event.value | upper:'x' }}", "unexpected_argument", 17),
        ("{{ event.value | first_name:'x' }}", "unexpected_argument", 17),
        ("{{ event.value | default:cliente }}", "invalid_argument", 25),
        ('{{ event.value | money:"reais" }}', "invalid_argument", 23),
        ('{{ event.value | default:"x }}', "unterminated_string", 25),
        ('{{ "abc }}', "unterminated_string", 3),
        ("{{ event.value + 1 }}", "unexpected_character", 15),
        ("{{ event.value event.x }}", "unexpected_character", 15),
        ("{{ event.a b }}", "unexpected_character", 11),
        ("{{ event.a } }", "unexpected_character", 11),
        ("{{ event.value.__class__ | x }}", "unknown_filter", 27),
    ],
)
def test_parse_template_syntax_errors(text: str, code: str, position: int) -> None:
    with pytest.raises(TemplateSyntaxError) as excinfo:
        parse_template(text)
    assert (excinfo.value.code, excinfo.value.position) == (code, position)
    assert f"position {position}" in str(excinfo.value)


def test_template_syntax_error_reports_line_and_column() -> None:
    with pytest.raises(TemplateSyntaxError) as excinfo:
        parse_template("Olá!\nSeu pedido {{ event.x | nope }} saiu.")
    error = excinfo.value
    assert (error.line, error.column, error.position) == (2, 25, 29)
    assert str(error) == (
        "unknown filter 'nope' (known: default, first_name, lower, money, upper) "
        "(position 29, line 2, column 25)"
    )
    assert isinstance(error, SinalError)
    assert isinstance(error, ValueError)


def test_parse_template_builds_parts() -> None:
    template = parse_template('Oi {{ contact.name | default:"você" }}, {{ event.value }}!')
    assert template == Template(
        'Oi {{ contact.name | default:"você" }}, {{ event.value }}!',
        (
            "Oi ",
            Expression(("contact", "name"), None, (FilterCall("default", "você"),), 3),
            ", ",
            Expression(("event", "value"), None, (), 40),
            "!",
        ),
    )
    assert template.paths == (("contact", "name"), ("event", "value"))


def test_parse_template_accepts_other_roots_when_asked() -> None:
    template = parse_template("{{ execution.id }}", roots={"execution"})
    assert render(template, {"execution": {"id": "e1"}}) == "e1"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("properties.total", ("properties", "total")),
        ("properties.items[0].sku", ("properties", "items", 0, "sku")),
        ("properties.items[0][1]", ("properties", "items", 0, 1)),
        ("properties.número_pedido", ("properties", "número_pedido")),
        ("properties.line-items", ("properties", "line-items")),
        ("properties.$ref", ("properties", "$ref")),
        ("value", ("value",)),
    ],
)
def test_parse_path_valid(text: str, path: tuple[str | int, ...]) -> None:
    assert parse_path(text) == path


@pytest.mark.parametrize(
    "text",
    ["", ".", "a.", "a..b", "a[", "a[]", "a[x]", "a[-1]", "a b", "a|b", "a:b", "[0]", "a.b}",
     ".".join(["a"] * 17)],
)  # fmt: skip
def test_parse_path_invalid(text: str) -> None:
    with pytest.raises(TemplateSyntaxError) as excinfo:
        parse_path(text)
    assert excinfo.value.code == "invalid_path"


@pytest.mark.parametrize(
    ("root", "path", "found"),
    [
        ({"a": {"b": [10, 20]}}, ("a", "b", 1), 20),
        ({"a": {"b": [10, 20]}}, ("a", "b", 2), MISSING),
        ({"a": {"b": [10, 20]}}, ("a", "b", "0"), MISSING),
        ({"a": (1, 2)}, ("a", 0), 1),
        ({"a": "text"}, ("a", 0), MISSING),
        ({"a": None}, ("a", "b"), MISSING),
        ({"0": "x"}, (0,), MISSING),
        ({"a": None}, ("a",), None),
        ([{"a": 1}], (0, "a"), 1),
    ],
)
def test_lookup(root: object, path: tuple[str | int, ...], found: object) -> None:
    assert lookup(root, path) == found


def test_render_value_renders_every_string_inside_components() -> None:
    components = [
        {"type": "body", "parameters": [{"type": "text", "text": "{{ contact.name | first_name }}"},
                                        {"type": "text", "text": "{{ event.value | money }}"}]},
        {"type": "button", "index": 0, "parameters": [{"type": "payload", "payload": "p-1"}]},
    ]  # fmt: skip
    assert render_value(components, CONTEXT) == [
        {"type": "body", "parameters": [{"type": "text", "text": "maria"},
                                        {"type": "text", "text": "R$ 1.297,90"}]},
        {"type": "button", "index": 0, "parameters": [{"type": "payload", "payload": "p-1"}]},
    ]  # fmt: skip


# --------------------------------------------------------------------------- properties

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.decimals()
    | st.text(max_size=10)
    | st.datetimes()
    | st.uuids(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["name", "value", "currency", "x", "0"]), inner, max_size=4
        )
    ),
    max_leaves=20,
)
_contexts = st.dictionaries(st.sampled_from(["event", "contact", "other"]), _json, max_size=3)
_templates = st.sampled_from(
    [
        "Olá {{ contact.name | first_name | upper }}, {{ event.value | money }}!",
        '{{ event.x | money:"USD" | default:"—" }} {{ contact.x[0].value | lower }}',
        "{{ event.currency }} {{ event.value }} {{ event }} {{ contact }}",
        '{{ contact.name | default:"cliente" | first_name }} {{ event.x.name[2] }}',
    ]
)


@settings(database=None, max_examples=200)
@given(_templates, _contexts)
def test_render_never_raises_on_arbitrary_contexts(text: str, context: dict[str, Any]) -> None:
    assert isinstance(render_text(text, context), str)


@settings(database=None, max_examples=500)
@given(st.one_of(st.text(alphabet=list("{}|:'\" .[]0aevntcox\\"), max_size=40), st.text()))
def test_parse_template_raises_only_syntax_errors(text: str) -> None:
    position = -1
    try:
        template = parse_template(text)
    except TemplateSyntaxError as exc:
        position = exc.position
    else:
        assert isinstance(render(template, {}), str)
        assert template.source == text
        return
    assert 0 <= position <= len(text)


@settings(database=None, max_examples=200)
@given(st.text(st.characters(blacklist_characters="{"), max_size=40))
def test_text_without_tags_renders_as_written(text: str) -> None:
    assert render_text(text, CONTEXT) == text
