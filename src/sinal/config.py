"""Settings, read from the environment (SINAL_*) only here, at the edges."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_DATABASE_URL = "sqlite:///sinal.db"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable, with its default."""

    database_url: str = DEFAULT_DATABASE_URL

    @classmethod
    def from_env(cls) -> Settings:
        """Settings from SINAL_* environment variables."""
        return cls(database_url=os.environ.get("SINAL_DATABASE_URL", DEFAULT_DATABASE_URL))
