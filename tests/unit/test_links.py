"""Tracked links' pure rules (tokens, preview fetchers, the click event, the URLs
of a message) and a message status row's forward-only merge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from sinal.events import prepare
from sinal.integrations.links import (
    click_event,
    find_urls,
    is_prefetch,
    is_preview_fetcher,
    is_token,
    new_token,
    rewrite_urls,
)
from sinal.store.messaging import MessageStatus

NOW = datetime(2026, 3, 2, 14, 0, 0, 250_000, tzinfo=UTC)
LINK = uuid4()


def test_new_tokens_are_url_safe_and_distinct() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(is_token(t) for t in tokens)


@pytest.mark.parametrize("text", ["", "short", "a" * 17, "a" * 15 + "/", "a" * 15 + "=", "á" * 16])
def test_is_token_refuses_other_shapes(text: str) -> None:
    assert not is_token(text)


@pytest.mark.parametrize(
    ("agent", "preview"),
    [
        ("WhatsApp/2.24.8.78 A", True),
        ("WhatsApp/2.23.20.0 i", True),
        ("facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)", True),
        ("Facebot", True),
        ("TelegramBot (like TwitterBot)", True),
        ("Mozilla/5.0 (Linux; Android 14) Chrome/124 Mobile Safari/537.36", False),
        ("Mozilla/5.0 (Linux; Android 14; wv) Chrome/124 WhatsApp/2.24.8.78", False),
        ("Mozilla/5.0 (iPhone) Mobile/15E148 [FBAN/FBIOS;FBAV/450.0]", False),
        ("", False),
        (None, False),
    ],
)
def test_preview_fetchers_are_told_from_people(agent: str | None, preview: bool) -> None:
    assert is_preview_fetcher(agent) == preview


@pytest.mark.parametrize(
    ("headers", "prefetch"),
    [
        ({"sec-purpose": "prefetch"}, True),
        ({"sec-purpose": "prefetch;prerender"}, True),
        ({"sec-purpose": "prefetch; anonymous-client-ip"}, True),
        ({"purpose": "prefetch"}, True),
        ({"purpose": "Prefetch"}, True),
        ({"x-purpose": "preview"}, True),
        ({"x-moz": "prefetch"}, True),
        ({}, False),
        ({"sec-purpose": ""}, False),
        ({"sec-fetch-mode": "navigate", "sec-fetch-dest": "document"}, False),
        ({"x-purpose": "navigate"}, False),
    ],
)
def test_browser_prefetches_are_told_from_clicks(headers: dict[str, str], prefetch: bool) -> None:
    assert is_prefetch(headers) == prefetch


def _click(now: datetime, link_id: UUID | None = None) -> str | None:
    event = click_event(
        account_id=uuid4(), contact_id=uuid4(), link_id=link_id or LINK, url="https://x.com",
        campaign=None, automation_execution_id=None, user_agent="ua", now=now,
    )  # fmt: skip
    return prepare(event, now).unique_event_id


def test_clicks_within_one_second_share_an_id_and_later_ones_do_not() -> None:
    assert _click(NOW) == _click(NOW + timedelta(milliseconds=500))
    assert _click(NOW) != _click(NOW + timedelta(seconds=1))
    assert _click(NOW) != _click(NOW, uuid4())
    assert _click(NOW) == f"tracking:link:{LINK}:{int(NOW.timestamp())}"


def _status(status: str, when: int, code: int | None = None) -> MessageStatus:
    at = datetime.fromtimestamp(when, UTC)
    return MessageStatus(uuid4(), "wamid.x", uuid4(), status, False, code, None, at, at)


def test_message_status_only_moves_forward_and_failed_keeps_its_error() -> None:
    read = _status("read", 30).advanced_by(_status("delivered", 20))
    assert (read.status, read.status_at.second) == ("read", 30)
    failed = _status("delivered", 20).advanced_by(_status("failed", 40, 131047))
    assert (failed.status, failed.error_code) == ("failed", 131047)
    kept = failed.advanced_by(_status("read", 50))
    assert kept == failed
    templated = _status("sent", 10).advanced_by(
        MessageStatus(uuid4(), "wamid.x", uuid4(), "sent", True, None, None, NOW, NOW)
    )
    assert (templated.status, templated.is_template) == ("sent", True)


def _marked(text: str) -> str:
    return rewrite_urls(text, lambda url: f"<{url}>")


@pytest.mark.parametrize(
    ("text", "marked"),
    [
        ("Seu pedido: https://loja.com.br/p/1042", "Seu pedido: <https://loja.com.br/p/1042>"),
        ("Veja https://x.com/a.", "Veja <https://x.com/a>."),
        ("Veja https://x.com/a... e mais", "Veja <https://x.com/a>... e mais"),
        ("(https://x.com)", "(<https://x.com>)"),
        ("(veja https://x.com/a).", "(veja <https://x.com/a>)."),
        ("[https://x.com/a]", "[<https://x.com/a>]"),
        ("https://pt.wikipedia.org/wiki/Real_(moeda)", "<https://pt.wikipedia.org/wiki/Real_(moeda)>"),
        ("https://x.com/a?b=1&c=2, ok?", "<https://x.com/a?b=1&c=2>, ok?"),
        ("Pronto! https://x.com/a!", "Pronto! <https://x.com/a>!"),
        ("*https://x.com/promo*", "*<https://x.com/promo>*"),
        ("_https://x.com/promo_", "_<https://x.com/promo>_"),
        ('"https://x.com/a"', '"<https://x.com/a>"'),
        ("«https://x.com/a»", "«<https://x.com/a>»"),
        ("Link:https://x.com/a", "Link:<https://x.com/a>"),
        ("HTTPS://X.COM/A", "<HTTPS://X.COM/A>"),
        ("http://x.com/a\nhttps://y.com/b", "<http://x.com/a>\n<https://y.com/b>"),
        ("https://x.com/#/carrinho?id=9", "<https://x.com/#/carrinho?id=9>"),
        ("https://loja.com.br/promoção…", "<https://loja.com.br/promoção>…"),
        ("https://x.com/r?u=https://y.com", "<https://x.com/r?u=https://y.com>"),
        # emoji, symbols and punctuation outside ASCII end a URL; accented letters do not
        ("Confira https://loja.com/promo🔥🔥 hoje", "Confira <https://loja.com/promo>🔥🔥 hoje"),
        ("https://loja.com/promo❤️", "<https://loja.com/promo>❤️"),
        ("https://loja.com/a\ufe0f", "<https://loja.com/a>\ufe0f"),
        ("https://loja.com/a\u200d", "<https://loja.com/a>\u200d"),
        ("https://loja.com/a👍🏽", "<https://loja.com/a>👍🏽"),
        ("https://loja.com/a👩‍💻", "<https://loja.com/a>👩‍💻"),
        ("https://loja.com/a🇧🇷", "<https://loja.com/a>🇧🇷"),
        ("https://loja.com/a✅.", "<https://loja.com/a>✅."),
        ("https://loja.com/a→", "<https://loja.com/a>→"),
        ("https://loja.com/a€", "<https://loja.com/a>€"),
        ("詳細は https://shop.jp/p/1。", "詳細は <https://shop.jp/p/1>。"),
        ("「https://shop.jp/p/1」", "「<https://shop.jp/p/1>」"),
        ("（https://shop.jp/p/1）", "（<https://shop.jp/p/1>）"),
        ("https://loja.com/a—b", "<https://loja.com/a>—b"),
        ("https://loja.com.br/promoção", "<https://loja.com.br/promoção>"),
        ("https://loja.com.br/promoc\u0327a\u0303o!", "<https://loja.com.br/promoc\u0327a\u0303o>!"),
        ("https://loja.com.br/café?tamanho=º1²", "<https://loja.com.br/café?tamanho=º1²>"),
        ("https://ロジャ.jp/商品", "<https://ロジャ.jp/商品>"),
        ("https://a.com/1🔥https://b.com/2", "<https://a.com/1>🔥<https://b.com/2>"),
    ],
)  # fmt: skip
def test_message_urls_leave_the_sentence_around_them_outside(text: str, marked: str) -> None:
    assert _marked(text) == marked


@pytest.mark.parametrize(
    "text",
    [
        "mailto:ajuda@loja.com.br",
        "tel:+5511987654321",
        "ftp://x.com/a",
        "whatsapp://send?phone=5511987654321",
        "wa.me/5511987654321",
        "www.loja.com.br",
        "xhttps://x.com",
        "/r/https://x.com",
        "https://",
        "https://.",
        "https://user:senha@x.com/a",
        "https://x.com/" + "a" * 2048,
        "https://loja.com:99999/x",
        "Veja https://a..b/promo!",
        "Sem links aqui.",
    ],
)
def test_message_text_without_an_http_url_to_track_is_unchanged(text: str) -> None:
    assert find_urls(text) == []
    assert _marked(text) == text


def test_message_urls_are_found_in_order_with_their_spans() -> None:
    text = "a https://x.com/1 b (https://y.com/2)."
    assert [text[s:e] for s, e in find_urls(text)] == ["https://x.com/1", "https://y.com/2"]
    seen: list[str] = []

    def record(url: str) -> str:
        seen.append(url)
        return url

    rewrite_urls(text, record)
    assert seen == ["https://x.com/1", "https://y.com/2"]
