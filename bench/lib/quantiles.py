"""Latency quantiles as tailmesh's histograms read them (the ceil(q n)-th
smallest), their percentile-bootstrap 95 % intervals, and whether two
configurations' quantiles lie inside each other's intervals (either way
round): the check bench/generators.sh judges its goal by.

Usage:
  quantiles.py round ONE.lat MANY.lat ROUND Q...
      one round: on stdout a line `pQ many / one<TAB>ratio` per quantile
      (for rounds.sh's round_values), on stderr one line saying, for each
      quantile, both values and whether one lies inside the other's
      interval
  quantiles.py pooled DIR ROUNDS Q...
      every round's DIR/one-R.lat and DIR/many-R.lat pooled, each interval
      from resampling the rounds and then each round's requests (so it
      holds what moves from one run to the next as well as the sampling):
      one line of each quantile, its interval and whether it lies inside

A .lat file holds one latency (us) per line.
"""

import random
import sys

REPLICATES = 1000


def quantiles(xs, qs):
    """Each q's ceil(q n)-th smallest of xs."""
    xs = sorted(xs)
    n = len(xs)
    return [xs[max(1, min(n, -(-int(q * n * 1e9) // int(1e9)))) - 1] for q in qs]


def intervals(runs, qs):
    """The 95 % interval of each quantile of the runs pooled: each replicate
    resamples the runs, then each chosen run's values."""
    rng = random.Random(1)
    reps = []
    for _ in range(REPLICATES):
        pooled = []
        for run in rng.choices(runs, k=len(runs)):
            pooled += rng.choices(run, k=len(run))
        reps.append(quantiles(pooled, qs))
    out = []
    for i in range(len(qs)):
        column = sorted(rep[i] for rep in reps)
        out.append((column[int(0.025 * REPLICATES)], column[int(0.975 * REPLICATES) - 1]))
    return out


def compare(one, many, qs):
    """Per quantile: one's value, its interval, many's, its interval, and
    whether either value lies inside the other's interval."""
    a, b = quantiles(sum(one, []), qs), quantiles(sum(many, []), qs)
    for q, x, y, (alo, ahi), (blo, bhi) in zip(qs, a, b, intervals(one, qs), intervals(many, qs)):
        yield q, x, (alo, ahi), y, (blo, bhi), blo <= x <= bhi or alo <= y <= ahi


def lat(path):
    return [float(x) for x in open(path)]


def main(argv):
    if len(argv) >= 5 and argv[1] == "round":
        one, many, r, qs = [lat(argv[2])], [lat(argv[3])], argv[4], [float(q) for q in argv[5:]]
        cells = []
        for q, x, _, y, _, inside in compare(one, many, qs):
            cells.append(f"p{q * 100:g} {x:.0f}/{y:.0f}us {'in' if inside else 'OUT'}")
            print(f"p{q * 100:g} many / one\t{y / x!r}")
        print(f"round {r}: " + ", ".join(cells), file=sys.stderr)
    elif len(argv) >= 4 and argv[1] == "pooled":
        d, rounds, qs = argv[2], int(argv[3]), [float(q) for q in argv[4:]]
        one = [lat(f"{d}/one-{r}.lat") for r in range(1, rounds + 1)]
        many = [lat(f"{d}/many-{r}.lat") for r in range(1, rounds + 1)]
        cells = [
            f"p{q * 100:g} {x:.0f} [{alo:.0f}, {ahi:.0f}] / {y:.0f} [{blo:.0f}, {bhi:.0f}]us "
            + ("in" if inside else "OUT")
            for q, x, (alo, ahi), y, (blo, bhi), inside in compare(one, many, qs)
        ]
        print("  " + ", ".join(cells))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
