"""A series' sealed noise state: it opens only with its key, for its series, step and attempt; a tampered byte or
another key fails the series by name, never showing the state."""

from __future__ import annotations

import pytest

from dp_operators.continual.state import SeriesKey, SeriesKeyError, open_sealed, seal, state_digest

DRAWS = [-123456789012, 0, 2**70, 5]


def test_a_sealed_step_opens_with_its_key_series_step_and_attempt():
    key = SeriesKey.generate()
    sealed = seal(key, "s1", 3, 1, DRAWS)
    assert open_sealed(key, "s1", 3, 1, sealed) == DRAWS
    assert b"123456789012" not in sealed  # the draws are not readable in the stored bytes
    assert seal(key, "s1", 3, 1, DRAWS) != sealed  # a fresh nonce each time
    assert len(state_digest(sealed)) == 64


@pytest.mark.parametrize(("series", "step", "attempt"), [("s2", 3, 1), ("s1", 4, 1), ("s1", 3, 2)],
                         ids=["another series", "another step", "another attempt"])
def test_a_sealed_step_moved_elsewhere_does_not_open(series, step, attempt):
    key = SeriesKey.generate()
    sealed = seal(key, "s1", 3, 1, DRAWS)
    with pytest.raises(SeriesKeyError, match="does not open with this series key") as refused:
        open_sealed(key, series, step, attempt, sealed)
    assert "123456789012" not in str(refused.value)


def test_another_key_a_missing_key_and_a_flipped_byte_fail_the_series():
    key, other = SeriesKey.generate(), SeriesKey.generate()
    sealed = seal(key, "s1", 0, 1, DRAWS)
    with pytest.raises(SeriesKeyError, match=f"key id {other.key_id}.*cannot go on with fresh noise"):
        open_sealed(other, "s1", 0, 1, sealed)
    with pytest.raises(SeriesKeyError, match="no series key"):
        open_sealed(None, "s1", 0, 1, sealed)
    flipped = bytearray(sealed)
    flipped[20] ^= 1
    with pytest.raises(SeriesKeyError):
        open_sealed(key, "s1", 0, 1, bytes(flipped))


def test_a_series_key_is_64_hex_digits_and_never_shown():
    key = SeriesKey.generate()
    assert SeriesKey.from_text(f" {key.text}\n") == key and len(key.text) == 64
    assert key.text not in repr(key) and key.key_id in repr(key)
    with pytest.raises(ValueError, match="a series key is 64 hex digits") as refused:
        SeriesKey.from_text("zz" * 32)
    assert "zz" not in str(refused.value)
    with pytest.raises(ValueError, match="got 16 bytes"):
        SeriesKey.from_text("ab" * 16)
