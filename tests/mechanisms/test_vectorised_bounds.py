"""The discrete Laplace floor table (dp_operators.mechanisms.vectorised_bounds.laplace_floor_proof) built from
128-bit limb products is the table of the step-by-step proof, entry for entry, and its limb arithmetic bounds the
products it stands for."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from dp_operators.mechanisms import vectorised_bounds as vb

TABLE = 1 << 20  # vectorised._MAX_TABLE


def stepwise_floors(t: int, s: int, max_len: int) -> list[int]:
    """The step-by-step construction (one power of q per entry, a division per bound), restarted 64 bits higher
    while a floor is unproven: the reference the limb construction must reproduce."""
    precision = vb.laplace_start_precision(t, s)
    top = (1 << 64) - 1
    while True:
        w = precision + max(max_len, 2).bit_length() + 80
        one = 1 << w
        q_lo, q_hi = vb.exp_neg_bounds(s, t, w)
        pw_lo, pw_hi = q_lo, q_hi
        floors: list[int] = []
        for _ in range(max_len):
            g_lo = one - vb._ceil_div((2 * pw_hi) << w, one + q_hi)
            g_hi = one - ((2 * pw_lo) << w) // (one + q_lo)
            if g_lo >> (w - 64) != g_hi >> (w - 64):
                break
            floors.append(g_lo >> (w - 64))
            if floors[-1] == top:
                return floors
            pw_lo, pw_hi = (pw_lo * q_lo) >> w, vb._ceil_div(pw_hi * q_hi, one)
        else:
            return floors
        precision += vb.PRECISION_STEP


@pytest.mark.parametrize(
    "scale,max_len",
    [
        pytest.param(Fraction(64), TABLE, id="64 (shortest table on the limb path)"),
        pytest.param(Fraction(3000, 7), TABLE, id="3000/7"),
        pytest.param(Fraction(10**4), TABLE, id="10^4 (the table's limit is 2^14)"),
        pytest.param(Fraction(70000, 3), TABLE, id="70000/3 (capped at 2^20 entries)"),
        pytest.param(Fraction(10**6), TABLE, id="10^6"),
        pytest.param(Fraction(1000), 5000, id="1000, capped at 5000"),
        pytest.param(Fraction(65), 1025, id="65, one row and one entry"),
    ],
)
def test_limb_floors_equal_the_stepwise_floors(scale, max_len):
    """The floors from limb products are those of the step-by-step proof, with the same length."""
    proof = vb.laplace_floor_proof(scale.numerator, scale.denominator, max_len)
    assert proof.floors == stepwise_floors(scale.numerator, scale.denominator, max_len)
    assert proof.rounds == 1 and all(type(f) is int for f in proof.floors[:3])


def test_product_ceilings_bound_the_exact_ceiling():
    """For random 128-bit X and Y (X below 2^128 - 2^67, as the table keeps it), the lower and upper results
    enclose ceil(X Y / 2^192), the upper at most one above it."""
    rng = random.Random(20201)  # the operands of a check, not noise
    xs = [rng.getrandbits(128) for _ in range(40)] + [(1 << 128) - (1 << 67) - 1, 0, 1 << 64]
    ys = [rng.getrandbits(128) for _ in range(40)] + [(1 << 128) - 1, 1, (1 << 96) + 5]
    low = vb._product_ceilings(vb._limbs(xs), vb._limbs(ys), upper=False)
    high = vb._product_ceilings(vb._limbs(xs), vb._limbs(ys), upper=True)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            exact = vb._ceil_div(x * y, 1 << 192)
            assert int(low[i, j]) <= exact <= int(high[i, j]) <= exact + 1
    assert low.dtype == high.dtype == np.uint64
