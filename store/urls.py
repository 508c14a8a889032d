"""PostgreSQL URLs among --db values: told apart from SQLite paths, and what may be printed or logged of
them (a URL's password, in its user part or a `password=` parameter, becomes ***)."""

from __future__ import annotations

import os
import re

URL_SCHEMES = ("postgresql://", "postgres://")
_USER_PASSWORD = re.compile(r"^(?P<head>[a-z]+://[^:/@?#]*:)[^@/?#]*(?P<tail>@)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.IGNORECASE)


def is_url(db: str | os.PathLike[str]) -> bool:
    """True for a PostgreSQL URL; anything else is a SQLite file path."""
    return isinstance(db, str) and db.lower().startswith(URL_SCHEMES)


def mask(db: str | os.PathLike[str]) -> str:
    """The --db value safe to print: a URL with its password replaced by ***; a path as it is."""
    text = os.fspath(db)
    if not is_url(text):
        return text
    text = _USER_PASSWORD.sub(r"\g<head>***\g<tail>", text)
    return _QUERY_PASSWORD.sub(r"\g<head>***", text)


def scrub(text: str, db: str) -> str:
    """text (an error message, say) with db's password, if any, masked wherever it appears."""
    if not is_url(db):
        return text
    text = text.replace(db, mask(db))
    for secret in _secrets(db):
        text = text.replace(secret, "***")
    return text


def _secrets(db: str) -> list[str]:
    found = [m.group(0)[len(m.group("head")) : -1] for m in _USER_PASSWORD.finditer(db)]
    found += [m.group(0)[len(m.group("head")) :] for m in _QUERY_PASSWORD.finditer(db)]
    return [s for s in found if s]
