"""The two URL policies: targets (webhook steps, tracked links) and connections' base URLs,
one set of rules, each refusal naming the field and saying why."""

from __future__ import annotations

import pytest

from sinal.urls import UrlProblem, base_url_problem, target_url_problem, with_ascii_host


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://lojadaana.com.br/p/camiseta?cor=azul#m", True),
        ("http://127.0.0.1:8080/x", True),  # where a host resolves is checked as requests leave
        ("HTTPS://LOJA.COM.BR", True),
        ("https://loja.com.br/" + "a" * 2100, False),
        ("/p/camiseta", False),
        ("lojadaana.com.br", False),
        ("javascript:alert(1)", False),
        ("data:text/html,hi", False),
        ("ftp://loja.com.br/a", False),
        ("https://", False),
        ("https://loja.com.br/a b", False),
        ("https://loja.com.br/\r\nSet-Cookie: x", False),
        ("https://loja.com.br/p\u009b", False),  # a C1 control, invisible
        ("https://loja.com.br/p\ud800", False),  # a lone surrogate
        ("https://ana:senha@loja.com.br/", False),
        ("http://[::1", False),
        # a port and a host an HTTP client can use
        ("https://loja.com:8443/x", True),
        ("https://loja.com:/x", True),  # an empty port is the scheme's
        ("http://[::1]:8080/x", True),
        ("https://lojinha.com.br./p", True),
        ("https://promoção.com.br/p", True),
        ("https://loja.com:99999/x", False),
        ("https://loja.com:abc/", False),
        ("https://loja.com:-1/", False),
        ("https://loja.com:0/", False),
        ("https://a..b/", False),
        ("https://.loja.com/", False),
        ("https://" + "a" * 64 + ".com/", False),
        ("https://999.1.1.1/", False),
        ("https://é..com/", False),
    ],
)
def test_target_url_must_be_absolute_http(url: str, ok: bool) -> None:
    assert (target_url_problem(url) is None) == ok


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://graph.facebook.com/v21.0", True),
        ("http://127.0.0.1:8080", True),
        ("https://ai.example.com/v1/", True),
        ("https://ai.example.com/v1?api-version=2024-06-01", False),
        ("https://ai.example.com/v1?", False),  # an empty query: the path would follow "?"
        ("https://ai.example.com/v1#chat", False),
        ("https://ai.example.com/v1#", False),
        ("https://ana:sk-live@ai.example.com/v1", False),
        (" https://ai.example.com/v1", False),  # httpx reads it as a relative URL
        ("https://ai.exa\nmple.com/v1", False),  # urlsplit drops the newline, httpx refuses it
        ("https://ai.example.com/v1\x7f", False),
        ("ftp://ai.example.com/v1", False),
        ("https://a..b/v1", False),
    ],
)
def test_base_url_is_a_target_url_with_no_query_or_fragment(url: str, ok: bool) -> None:
    assert (base_url_problem(url, "base_url") is None) == ok


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://x.com/" + "a" * 2048, "url is longer than 2048 characters"),
        ("https://x.com/a b", "url contains spaces or control characters; percent-encode them"),
        (
            "https://x.com/\u202egpj.exe",
            "url contains an invisible bidirectional control "
            "character (U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069): it shows the URL as "
            "another one",
        ),
        ("http://[::1", "url is not a valid URL: Invalid IPv6 URL"),
        ("/hook", "url must be absolute and start with http:// or https://"),
        ("https:///hook", "url has no host; give an absolute URL, like https://example.com/path"),
        ("https://x.com:99999/", "url's port must be a number from 1 to 65535"),
        ("https://a..b/", "url's host 'a..b' has an empty label or one longer than 63 characters"),
        ("https://999.1.1.1/", "url's host '999.1.1.1' is not an IPv4 address"),
    ],
)
def test_target_url_problem_names_the_field_and_says_why(url: str, problem: str) -> None:
    found = target_url_problem(url)
    assert found is not None
    assert found.message == problem
    assert found.code == ("unsupported_scheme" if url == "/hook" else "invalid_url")


def test_base_url_problem_says_why_a_query_is_refused() -> None:
    assert base_url_problem("https://ai.example.com/v1?k=1", "base_url") == UrlProblem(
        "invalid_url", "base_url must have no query or fragment: paths are appended to it"
    )
    found = base_url_problem("https://ana:pw@ai.example.com", "api_base_url")
    assert found is not None
    assert found.message.startswith("api_base_url must not carry a user name or password")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://lojadaana.com.br/p?cor=azul#m", "https://lojadaana.com.br/p?cor=azul#m"),
        ("HTTPS://LOJA.COM.BR/P", "HTTPS://LOJA.COM.BR/P"),  # ASCII: as given
        ("http://[::1]:8080/x", "http://[::1]:8080/x"),
        # "аpple.com" with a Cyrillic "а" (U+0430): it prints as Apple's host
        ("https://\u0430pple.com/login", "https://xn--pple-43d.com/login"),
        (
            "https://\u0430pple.com:8443/a?b=\u0430#\u0430",
            "https://xn--pple-43d.com:8443/a?b=\u0430#\u0430",
        ),
        ("https://PROMOÇÃO.com.br/P", "https://xn--promoo-7ta5a.com.br/P"),
        ("https://promoção.com.br", "https://xn--promoo-7ta5a.com.br"),
    ],
)
def test_with_ascii_host_gives_an_internationalized_host_as_requested(
    url: str, expected: str
) -> None:
    assert target_url_problem(url) is None
    assert with_ascii_host(url) == expected
