"""A server's own words in countersink's error lines, without the credentials it may echo back.

A token endpoint or a schema registry that refuses a request may quote what it was sent (some do; so may a
proxy or firewall in front of them), and what it was sent is the credential in the forms HTTP carries it:
form-encoded, paired with the user name, base64-encoded behind ``Basic``. :func:`server_words` keeps the words
an operator needs (``invalid_client``, ``Subject not found``) and removes every such form, before the text is
cut to length (a cut made first could leave part of a secret behind the redaction).
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Iterable

REDACTED = "**********"
MAX_WORDS_CHARS = 200
# An Authorization header's value however a server quotes it: the scheme, then the credentials.
_AUTHORIZATION = re.compile(r"\b(Basic|Bearer|Digest|Negotiate|Token)\s+\S+", re.IGNORECASE)


def _forms(secret: str, user: str | None) -> set[str]:
    """``secret`` as HTTP may have carried it, alone and paired with ``user`` (each base64-encoded too)."""
    encodings = {secret, urllib.parse.quote_plus(secret), urllib.parse.quote(secret, safe="")}
    forms = set(encodings)
    if user is not None:
        for user_form in {user, urllib.parse.quote_plus(user), urllib.parse.quote(user, safe="")}:
            forms.update(f"{user_form}:{form}" for form in encodings)
    for form in list(forms):
        for charset in ("utf-8", "latin-1"):  # HTTP Basic's bytes: clients differ (aiohttp's default is latin-1)
            try:
                raw = form.encode(charset)
            except UnicodeEncodeError:
                continue
            encoded = base64.b64encode(raw).decode()
            forms.update({encoded, encoded.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")})
    return {form for form in forms if form}


def server_words(text: object, secrets: Iterable[tuple[str | None, str | None]] = ()) -> str:
    """``text`` (a server's reason) as one printable line of at most :data:`MAX_WORDS_CHARS` characters, with
    every form of each ``(user, secret)`` pair's secret and any quoted Authorization value removed."""
    line = "".join(c if c.isprintable() else " " for c in str(text))
    line = _AUTHORIZATION.sub(lambda match: f"{match.group(1)} {REDACTED}", line)
    forms = set().union(*(_forms(secret, user) for user, secret in secrets if secret))
    for form in sorted(forms, key=len, reverse=True):  # the longest first: a pair before the secret alone
        line = line.replace(form, REDACTED)
    return line[:MAX_WORDS_CHARS]


def shown_url(url: str) -> str:
    """``url`` for a log line or an error: without its query and fragment, which may carry a credential
    (``?client_secret=``)."""
    parts = urllib.parse.urlsplit(url)
    hidden = "?…" if parts.query or parts.fragment else ""
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")) + hidden


__all__ = ["MAX_WORDS_CHARS", "REDACTED", "server_words", "shown_url"]
