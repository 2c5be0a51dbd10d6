"""ISO 4217 currency codes (from pycountry's copy of the standard) and their minor units."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Final

import pycountry

# ISO 4217's minor unit (decimal places) of every active code where it is not 2, from the
# standard's list one (pycountry carries no minor units). Codes the standard gives none
# ("N.A.": gold, SDR, test codes) format with 2, as any other.
_NO_MINOR_UNIT: Final = (
    "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
    "VUV", "XAF", "XOF", "XPF",
)  # fmt: skip
_MINOR_UNITS: Final[Mapping[str, int]] = MappingProxyType(
    {
        **dict.fromkeys(_NO_MINOR_UNIT, 0),
        **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
        **dict.fromkeys(("CLF", "UYW"), 4),
    }
)


@cache
def currency_codes() -> frozenset[str]:
    """Every active ISO 4217 alphabetic code."""
    return frozenset(c.alpha_3 for c in pycountry.currencies)


def is_currency(code: str) -> bool:
    """Whether `code` (upper case) is an ISO 4217 currency code."""
    return code in currency_codes()


def minor_units(code: str) -> int:
    """Decimal places of `code`'s minor unit (upper case): 0 for JPY, 3 for KWD, else 2."""
    return _MINOR_UNITS.get(code, 2)
