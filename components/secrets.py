"""Secrets never reach a message, a log line, an MLflow param or a repr: URLs lose their
``user:password@`` part, values under secret-looking keys become ``***``."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SECRET_KEY = re.compile(r"secret|password|token|credential|access_key|api_key", re.IGNORECASE)
URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(url: str) -> str:
    """``url`` without any ``user:password@`` part (for messages and reprs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def redact_text(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it masked."""
    return URL_USERINFO.sub("***@", text)


def mask_secrets(key: str, value: Any) -> str:
    """The value as logged: secrets by key name become ``***``; credentials inside URLs too."""
    if SECRET_KEY.search(key):
        return "***"
    return redact_text(str(value))
