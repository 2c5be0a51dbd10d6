"""ISO 4217 currency codes (from pycountry's copy of the standard)."""

from __future__ import annotations

from functools import cache

import pycountry


@cache
def currency_codes() -> frozenset[str]:
    """Every active ISO 4217 alphabetic code."""
    return frozenset(c.alpha_3 for c in pycountry.currencies)


def is_currency(code: str) -> bool:
    """Whether `code` (upper case) is an ISO 4217 currency code."""
    return code in currency_codes()
