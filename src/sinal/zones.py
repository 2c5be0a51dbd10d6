"""IANA time zones: the names an account, an aggregate and a provider's time may use.

`zoneinfo` opens any file of a zoneinfo directory, some of which are no zone, so a name
is checked against `iana_zones` before it is opened.
"""

from __future__ import annotations

from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

__all__ = ["iana_zone", "iana_zones"]


@cache
def iana_zones() -> frozenset[str]:
    """The zones `zoneinfo` knows, less files of a zoneinfo directory that are no zone:
    "localtime" (the host's own, a link to /etc/localtime), "Factory" ("-00", no time at
    all) and "posixrules" (New York's rules under another name). `available_timezones`
    already leaves out posix/ and right/."""
    return frozenset(available_timezones()) - {"localtime", "Factory", "posixrules"}


def iana_zone(name: str) -> ZoneInfo | None:
    """The IANA zone `name`, or None when it names none."""
    if name not in iana_zones():
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory
        return None
