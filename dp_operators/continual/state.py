"""A series' secret state: its noise draws, sealed with an AEAD under a key the workers hold (ADR 32).

The draws of earlier steps, with one published running total, give the true total: they must be readable by the
workers that continue the series and by nobody else (not the ledger's reader role, the dashboard, the audit log or
the task log). Each step's draws are sealed with AES-256-GCM (NIST SP 800-38D, through ``cryptography``'s
``AESGCM``) under the **series key**, with the series, the step and the ledger attempt that committed it as
associated data: a sealed step moved to another series, step or attempt does not open. The ledger stores the sealed
bytes with the step's commit and the SHA-256 of them in the step's audit event.

A worker whose key is missing or is not the series' key cannot open the state: the series fails
(:class:`SeriesKeyError`), and never continues with fresh noise, which would measure the steps again.

The series key is 32 random bytes written as 64 hex digits (``SeriesKey.generate().text``), held like the spend key:
in the ledger connection's extra on the workers, never in the ledger.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: Bytes of the random nonce prefixed to each sealed step (96 bits, as SP 800-38D recommends).
NONCE_BYTES = 12
#: The format of the sealed plaintext and associated data; a sealed step names it first.
FORMAT = b"dp-series-state-2"
#: Bytes of each draw in the plaintext (two's complement, big-endian): every draw takes the same room, so the
#: ciphertext's length (AES-GCM keeps the plaintext's) is the number of draws, a public parameter, never a
#: function of the noise. A draw beyond +-2^255 lattice units (probability below 2^-(2^200) for any parameter a
#: plan gives) is refused before anything is sealed.
DRAW_BYTES = 32


class SeriesKeyError(ValueError):
    """The series' state cannot be opened: no series key, or not the key it was sealed with, or sealed for another
    series, step or attempt. The series cannot go on: restore its key (a series never restarts with fresh noise)."""


@dataclass(frozen=True)
class SeriesKey:
    """The AES-256 key sealing a series' noise. ``repr`` never shows it.

    Args:
        secret: 32 bytes.

    Raises:
        ValueError: not 32 bytes.
    """

    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != 32:
            raise ValueError(f"a series key is 32 bytes (64 hex digits), got {len(self.secret)} bytes")

    @classmethod
    def from_text(cls, text: str) -> SeriesKey:
        """The key from its 64 hex digits (surrounding whitespace ignored).

        Raises:
            ValueError: not 64 hex digits (the message never shows the text).
        """
        try:
            secret = bytes.fromhex(text.strip())
        except ValueError:
            raise ValueError("a series key is 64 hex digits (dp_operators.continual.state.SeriesKey.generate()"
                             ".text makes one)") from None
        return cls(secret)

    @classmethod
    def generate(cls) -> SeriesKey:
        """A new random key (the OS CSPRNG)."""
        return cls(secrets.token_bytes(32))

    @property
    def text(self) -> str:
        return self.secret.hex()

    @property
    def key_id(self) -> str:
        """A public name of the key: the first 16 hex digits of SHA-256 over a label and the key (recorded with the
        series, so a worker with another key is told so before it opens anything)."""
        return hashlib.sha256(b"dp-series-key-id\0" + self.secret).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"SeriesKey(key_id={self.key_id!r})"


def _associated(series_id: str, step: int, attempt: int) -> bytes:
    return FORMAT + b"\0" + json.dumps([series_id, step, attempt], separators=(",", ":")).encode()


def seal(key: SeriesKey, series_id: str, step: int, attempt: int, draws: list[int]) -> bytes:
    """One step's draws (lattice units), sealed: ``nonce || AES-256-GCM(draws, DRAW_BYTES each)``, bound to the
    series, step and attempt as associated data; its length is a function of ``len(draws)`` only.

    Raises:
        ValueError: a draw beyond +-2^255 (see :data:`DRAW_BYTES`)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    try:
        plaintext = b"".join(int(value).to_bytes(DRAW_BYTES, "big", signed=True) for value in draws)
    except OverflowError:
        raise ValueError(f"a draw does not fit {DRAW_BYTES} bytes; nothing was sealed") from None
    return nonce + AESGCM(key.secret).encrypt(nonce, plaintext, _associated(series_id, step, attempt))


def open_sealed(key: SeriesKey | None, series_id: str, step: int, attempt: int, sealed: bytes) -> list[int]:
    """The draws :func:`seal` sealed for this series, step and attempt.

    Raises:
        SeriesKeyError: no key, or the key, series, step or attempt is not the one sealed (the AEAD tag fails), or
            the bytes are not a sealed step. The message names the series and step, never the state.
    """
    where = f"series {series_id!r} step {step} (attempt {attempt})"
    if key is None:
        raise SeriesKeyError(f"{where}: no series key to open its noise state with; give the workers the series key "
                             "(the ledger connection's extra series_key)")
    if len(sealed) <= NONCE_BYTES:
        raise SeriesKeyError(f"{where}: the stored state is not a sealed step")
    try:
        plaintext = AESGCM(key.secret).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:],
                                               _associated(series_id, step, attempt))
    except InvalidTag:
        raise SeriesKeyError(
            f"{where}: the noise state does not open with this series key (key id {key.key_id}): it was sealed "
            "with another key, or for another series, step or attempt. Restore the series' key; the series cannot "
            "go on with fresh noise"
        ) from None
    if len(plaintext) % DRAW_BYTES:
        raise SeriesKeyError(f"{where}: the opened state is not a list of draws")
    return [int.from_bytes(plaintext[i:i + DRAW_BYTES], "big", signed=True)
            for i in range(0, len(plaintext), DRAW_BYTES)]


def state_digest(sealed: bytes) -> str:
    """SHA-256 (hex) of a sealed step: what the step's audit event records."""
    return hashlib.sha256(sealed).hexdigest()
