"""Where a ledger lives: a SQLite file (a `Path`) or a PostgreSQL database (`PostgresLedger`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote_plus, urlsplit

from opspatch.errors import InputError

POSTGRES_SCHEMES = ("postgresql", "postgres")
"""The URL schemes libpq accepts; either selects the PostgreSQL ledger."""


@dataclass(frozen=True)
class PostgresLedger:
    """A PostgreSQL ledger, by its libpq URL (`postgresql://user@host:5432/db?host=/run/sock`)."""

    url: str

    def __str__(self) -> str:
        return self.url


LedgerLocation = Path | PostgresLedger
"""A SQLite file or a PostgreSQL database."""

_PASSWORD_KEY = re.compile(r"(^|\s)password\s*=", re.IGNORECASE)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
"""A URL's scheme (RFC 3986): text that starts with one names a server, never a file."""


def is_postgres_url(text: str) -> bool:
    """Whether `text` names a PostgreSQL ledger rather than a file."""
    return text.split("://", 1)[0].lower() in POSTGRES_SCHEMES and "://" in text


def ledger_location(text: str, *, given_by: str = "--ledger") -> LedgerLocation:
    """The ledger `text` names: a PostgreSQL URL, else a file path (`~` expanded).

    Raises:
        InputError: the URL carries a password (`given_by` names where it came from), has a
            scheme that is no ledger backend (`http://`, `mysql://`: never taken for a file
            path, which would give an operator a private file for a shared ledger), or the URL
            cannot be read.
    """
    scheme = _SCHEME.match(text)
    if scheme is not None and not is_postgres_url(text):
        # Only the scheme is said: the rest of a URL may hold a password.
        supported = " or ".join(f"{name}://" for name in POSTGRES_SCHEMES)
        raise InputError(
            f"{given_by}: {scheme.group(1)}:// is not a ledger opspatch supports; a ledger is "
            f"a PostgreSQL database ({supported}) or a SQLite file (its path, no scheme)",
            hint="give postgresql://USER@HOST:PORT/DATABASE for a team ledger, or a file path "
            "such as ./ledger.sqlite3 for a ledger of your own",
        )
    if not is_postgres_url(text):
        if _PASSWORD_KEY.search(text):
            # A libpq "key=value" string is not a file name: never create a file named after it.
            raise InputError(
                f"{given_by}: this looks like a libpq connection string with a password; "
                "opspatch takes a postgresql:// URL, without the password",
                hint="give postgresql://USER@HOST:PORT/DATABASE and put the password in "
                "PGPASSWORD or ~/.pgpass (chmod 600)",
            )
        return Path(text).expanduser()
    try:
        parts = urlsplit(text)
        has_password = parts.password is not None
        query_password = any(
            unquote_plus(item.split("=", 1)[0]).strip().lower() == "password"  # libpq decodes
            for item in parts.query.split("&")
            if item
        )
    except ValueError as exc:
        raise InputError(
            f"{given_by}: the PostgreSQL URL cannot be read ({exc})",
            hint="write it as postgresql://USER@HOST:PORT/DATABASE",
        ) from None
    if has_password or query_password:
        # Never echo the URL: it holds the secret.
        raise InputError(
            f"{given_by}: the PostgreSQL URL carries a password; opspatch refuses to take one "
            "there (it would show in the process list and the shell history)",
            hint="drop the password from the URL and give it to libpq in PGPASSWORD or "
            "~/.pgpass (chmod 600)",
        )
    return PostgresLedger(text)
