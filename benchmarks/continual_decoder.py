"""Cost of the square root's exact decoder (``dp_operators.continual.noise``) against the rational recurrence it
replaced, and of the exact noise on many cells' running totals.

Run by hand (never a timed test):

    .venv/bin/python benchmarks/continual_decoder.py [--horizons 365 1000] [--cells 50] [--repeats 3]

For each horizon T, the best of ``--repeats`` times (the module cache cleared before each):

- ``before``: the power series inverse of the rounded coefficients in :class:`~fractions.Fraction`, then its
  prefix sums (the decoder as it was; skipped above T = 2000, where it takes minutes);
- ``after``: :func:`~dp_operators.continual.noise.square_root_decoder` (integers over one power-of-two
  denominator), and the same as reduced fractions (:func:`~...square_root_decoder_fractions`, built only when
  ``SeriesNoise.decoder`` is read); both must equal ``before`` exactly;
- ``total_noise`` for ``--cells`` cells at the series' last step (one call per cell, each with its own history of
  ``T`` draws), the rational sum of the old decoder against the integer dot product of the new, equal exactly.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dp_operators.continual import Participation, SquareRootToeplitz  # noqa: E402
from dp_operators.continual import noise as module  # noqa: E402
from dp_operators.continual.plan import candidate  # noqa: E402
from dp_operators.continual.strategies import GRID_BITS  # noqa: E402


def fraction_decoder(horizon: int) -> list[Fraction]:
    """The decoder as computed before: the recurrence in rationals, then prefix sums."""
    c = [Fraction(n, 1 << GRID_BITS) for n in SquareRootToeplitz(horizon).numerators]
    inverse = [Fraction(1)]
    for n in range(1, horizon):
        inverse.append(-sum((c[s] * inverse[n - s] for s in range(1, n + 1)), Fraction(0)))
    prefix, running = [], Fraction(0)
    for value in inverse:
        running += value
        prefix.append(running)
    return prefix


def fraction_total(decoder: list[Fraction], history: list[list[int]], lattice: Fraction) -> Fraction:
    """``total_noise`` as computed before, for the square root."""
    t = len(history) - 1
    return sum((decoder[t - s] * draws[0] for s, draws in enumerate(history)), Fraction(0)) * lattice


def best(repeats: int, run, clear=lambda: None):
    times, result = [], None
    for _ in range(repeats):
        clear()
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def clear() -> None:
    module.square_root_decoder.cache_clear()
    module.square_root_decoder_fractions.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[365, 1000])
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(1)
    for horizon in args.horizons:
        strategy = SquareRootToeplitz(horizon)
        noise = module.SeriesNoise(strategy, candidate(strategy, Participation(1), Fraction(1), Fraction(1)))
        after, dyadic = best(args.repeats, lambda: module.square_root_decoder(horizon), clear)
        fractions_time, fractions = best(args.repeats, lambda: module.square_root_decoder_fractions(horizon),
                                         module.square_root_decoder_fractions.cache_clear)
        line = f"T={horizon:>5}: decoder after {after * 1e3:9.1f} ms (+ {fractions_time * 1e3:.1f} ms as fractions)"
        old = None
        if horizon <= 2000:
            before, old = best(1 if horizon > 400 else args.repeats, lambda: fraction_decoder(horizon))
            assert list(fractions) == old
            line += f", before {before * 1e3:9.1f} ms ({before / after:.0f}x)"
        line += f"; denominator 2^{dyadic.exponent}"
        print(line, flush=True)
        histories = [[[rng.randrange(-2**30, 2**30)] for _ in range(horizon)] for _ in range(args.cells)]
        noise.total_noise(histories[0])  # warm: the decoder is cached
        new_time, new = best(args.repeats, lambda: [noise.total_noise(history) for history in histories])
        line = f"         total_noise, {args.cells} cells at step {horizon - 1}: after {new_time * 1e3:.2f} ms"
        if old is not None:
            old_time, expected = best(args.repeats, lambda: [fraction_total(old, history, noise.lattice)
                                                             for history in histories])
            assert new == expected
            line += f", before {old_time * 1e3:.2f} ms ({old_time / new_time:.0f}x)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
