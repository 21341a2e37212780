"""Keys of the authenticated audit chain (HMAC-SHA256, RFC 2104 / FIPS 198-1).

Two keys, two roles (docs/adr/0020):

* the **governor key**, held by the privacy officer only, signs governance events (accounts created or updated,
  chains keyed by an upgrade). Without it nobody can write an event that changes a cap, an allowlist or an
  accountant and still passes ``dpctl ledger verify``.
* the **spend key**, held by the workers (the ledger connection's extra ``audit_key``), signs spend events
  (reserved, committed, released, abandoned, refused). The account row names the spend key it accepts
  (``spend_key_id``, a governed column), so rotating it is a governance event.

A key is any text of at least :data:`MIN_KEY_CHARS` characters (``dpctl ledger keygen`` prints 64 random hex
digits); it is used as its UTF-8 bytes. Events record the key's id, never the key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Shortest accepted key text (32 characters of random hex are 128 bits).
MIN_KEY_CHARS = 32

#: Environment variables read by :func:`key_from_environment`.
GOVERNOR_KEY_ENV = "DP_LEDGER_GOVERNOR_KEY"
SPEND_KEY_ENV = "DP_LEDGER_AUDIT_KEY"


@dataclass(frozen=True)
class AuditKey:
    """A secret key of the audit chain. ``repr`` never shows the secret.

    Args:
        secret: the key's bytes (at least :data:`MIN_KEY_CHARS` of them).

    Raises:
        ValueError: a shorter secret.
    """

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_KEY_CHARS:
            raise ValueError(
                f"an audit key needs at least {MIN_KEY_CHARS} characters (got {len(self.secret)}); "
                "make one with 'dpctl ledger keygen'"
            )

    @classmethod
    def from_text(cls, text: str) -> AuditKey:
        """A key from its text form (surrounding whitespace ignored). Raises :class:`ValueError` if too short."""
        return cls(text.strip().encode("utf-8"))

    @classmethod
    def generate(cls) -> AuditKey:
        """A fresh random key (256 bits from :mod:`secrets`, as 64 hex digits)."""
        return cls(secrets.token_hex(32).encode("ascii"))

    @property
    def text(self) -> str:
        return self.secret.decode("utf-8")

    @functools.cached_property
    def key_id(self) -> str:
        """16 hex digits naming the key (a truncated SHA-256 of a domain-separated secret; reveals nothing)."""
        return hashlib.sha256(b"dp-operators audit key id\0" + self.secret).hexdigest()[:16]

    def mac(self, message: bytes) -> str:
        """HMAC-SHA256 of ``message``, hex (64 characters)."""
        return hmac.digest(self.secret, message, "sha256").hex()

    def __repr__(self) -> str:
        return f"AuditKey(key_id={self.key_id!r})"


class Keyring(Mapping[str, AuditKey]):
    """Keys by id, for :func:`~dp_operators.ledger.verify.verify_ledger` (current and retired keys of both roles)."""

    def __init__(self, keys: Iterable[AuditKey | None] = ()) -> None:
        self._keys = {key.key_id: key for key in keys if key is not None}

    def __getitem__(self, key_id: str) -> AuditKey:
        return self._keys[key_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def read_key_file(path: str | Path) -> list[AuditKey]:
    """Keys from a file: one per line; blank lines and lines starting with ``#`` are skipped.

    Raises:
        ValueError: a line too short to be a key (the message gives the line number, not the line).
        OSError: the file cannot be read.
    """
    keys = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            keys.append(AuditKey.from_text(line))
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: {error}") from None
    return keys


def key_from_environment(variable: str) -> AuditKey | None:
    """The key in environment variable ``variable``, or ``None`` if it is unset or empty."""
    text = os.environ.get(variable, "").strip()
    return AuditKey.from_text(text) if text else None


def as_key(value: AuditKey | str | bytes | None) -> AuditKey | None:
    """Accept a key as :class:`AuditKey`, text or bytes (``None`` stays ``None``)."""
    if value is None or isinstance(value, AuditKey):
        return value
    if isinstance(value, bytes):
        return AuditKey(value)
    return AuditKey.from_text(value)
