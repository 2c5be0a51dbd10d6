"""Settings read from the environment: SINAL_PUBLIC_URL checked and tidied."""

from __future__ import annotations

import pytest

from sinal.config import Settings
from sinal.errors import ConfigurationError


@pytest.mark.parametrize(
    ("raw", "public_url"),
    [
        ("https://sin.al", "https://sin.al"),
        ("https://sin.al/", "https://sin.al"),  # no `//l/{token}` in short links
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("https://crm.lojadaana.com.br/sinal/", "https://crm.lojadaana.com.br/sinal"),
        ("  https://sin.al\n", "https://sin.al"),
        ("", ""),  # set but empty: the request's own, as when unset
    ],
)
def test_settings_public_url_accepts_an_http_base_and_strips_its_trailing_slash(
    raw: str, public_url: str
) -> None:
    assert Settings.from_env({"SINAL_PUBLIC_URL": raw}).public_url == public_url


@pytest.mark.parametrize(
    "raw",
    [
        "sin.al",  # no scheme: links would come out relative
        "sin.al/l",
        "localhost:8000",
        "//sin.al",
        "ftp://sin.al",
        "https://",
        "https://:8443",
        "https://sin.al:porta",
        "https://sin.al:99999",
        "https://sin.al?utm_source=whatsapp",
        "https://sin.al/?",
        "https://sin.al/#top",
        "https://sin al",
    ],
)
def test_settings_public_url_rejects_what_is_not_an_absolute_http_url(raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"SINAL_PUBLIC_URL": raw})
    assert str(caught.value) == (
        f"SINAL_PUBLIC_URL={raw!r} must be an absolute http:// or https:// URL with a host "
        "and no query or fragment, e.g. https://sin.al"
    )


def test_settings_public_url_is_unset_by_default() -> None:
    assert Settings.from_env({}).public_url == ""
