#!/usr/bin/env bash
# tailmesh search against queueing theory: searches scenarios/md1.toml (one
# slot, 1 ms fixed work: an M/D/1 queue) for the highest rate with p99 under
# 20 ms, SEARCHES times, and prints
# - each search's answer, its steps (goal: at most 12, confirmations
#   aside) and the spread of the answers (goal: within 5 % of each other);
# - the M/D/1 answer: the arrival rate at which P(W + D + o <= 20 ms) =
#   0.99, with W the M/D/1 waiting time (Erlang's formula), D the hop's
#   measured service time (its mean at the answer) and o the rest of the
#   end-to-end time (the run's p50 minus the hop's time to answer, at the
#   answer); and each answer over it (goal: within 5 %).
#
# Usage: bench/search.sh [-n SEARCHES] [-s STEP]
#   -n N      searches (default 3)
#   -s STEP   each step's length (default 20s)
#
# Uses a release build, or the binary TAILMESH_BIN names. Loopback only.
# Leaves nothing behind: the search is stopped by its PID (it stops its own
# hops) and the temp dir removed, on every exit path.
set -euo pipefail

BENCH=search
SEARCHES=3
STEP=20s
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--searches) SEARCHES="${2:?-n needs a number}"; shift 2 ;;
        -s|--step) STEP="${2:?-s needs a duration}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[[ $SEARCHES =~ ^[1-9][0-9]*$ ]] || { echo "$BENCH: -n wants a positive integer" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
steps_traps
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
cd "$REPO"
release_binary
busy_gate 0

for ((n = 1; n <= SEARCHES; n++)); do
    say "search $n of $SEARCHES (steps of $STEP)"
    if ! step INT "$BIN" search scenarios/md1.toml --slo 'p99<20ms' --step "$STEP" \
        --results "$TMP/results-$n" >"$TMP/search-$n.out" 2>&1; then
        say "tailmesh search failed:"
        cat "$TMP/search-$n.out" >&2
        exit 1
    fi
    echo "load average after search $n: $(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$TMP" "$SEARCHES" <<'PY'
import json, math, pathlib, sys

tmp, searches = pathlib.Path(sys.argv[1]), int(sys.argv[2])
BOUND, Q = 0.020, 0.99

def md1_waiting_cdf(lam, d, t):
    """P(W <= t) for M/D/1 with arrival rate lam and service time d
    (Erlang): (1 - rho) * sum_{k=0}^{floor(t/d)} (lam (k d - t))^k / k! e^{-lam (k d - t)}."""
    rho = lam * d
    if rho >= 1 or t < 0:
        return 0.0
    total = 0.0
    for k in range(int(math.floor(t / d)) + 1):
        x = lam * (k * d - t)
        total += x**k / math.factorial(k) * math.exp(-x)
    return (1 - rho) * total

def md1_answer(d, o):
    budget = BOUND - d - o
    lo, hi = 1.0, 1.0 / d * (1 - 1e-9)
    for _ in range(100):
        mid = (lo + hi) / 2
        if md1_waiting_cdf(mid, d, budget) >= Q:
            lo = mid
        else:
            hi = mid
    return lo

rows = []
for n in range(1, searches + 1):
    s = json.load(open(tmp / f"results-{n}" / "md1-search" / "search.json"))["searches"][0]
    a = s["answer"]
    steps = [st for st in s["steps"] if st["kind"] != "confirm"]
    if a["result"] != "found":
        print(f"search {n}: no answer ({a['result']}), {len(steps)} steps")
        continue
    at = [st for st in s["steps"] if st["verdict"]["rate"] == a["rate"]][-1]["verdict"]["run"]
    v = json.load(open(pathlib.Path(at) / "summary.json"))["variants"][0]
    hop = v["hops"][0]
    d = hop["service"]["mean_us"] / 1e6
    o = max(0.0, (v["latency"]["p50_us"] - hop["total"]["p50_us"]) / 1e6)
    theory = md1_answer(d, o)
    rows.append((n, a["rate"], a["fails_at"], len(steps), d, o, theory))
    print(f"search {n}: {a['rate']:.0f}/s (fails at {a['fails_at']:.0f}/s) in {len(steps)} steps "
          f"(+{len(s['steps']) - len(steps)} confirmations); D = {d * 1e6:.0f} us, o = {o * 1e6:.0f} us; "
          f"M/D/1: {theory:.0f}/s; answer / M/D/1 = {a['rate'] / theory:.3f}")
if rows:
    answers = [r[1] for r in rows]
    spread = max(answers) / min(answers) - 1
    worst = max(abs(r[1] / r[6] - 1) for r in rows)
    print(f"answers {', '.join(f'{x:.0f}' for x in answers)}/s: spread {spread * 100:.1f} % (goal <= 5 %): "
          f"{'met' if spread <= 0.05 else 'not met'}")
    print(f"farthest from M/D/1: {worst * 100:.1f} % (goal <= 5 %): {'met' if worst <= 0.05 else 'not met'}")
    print(f"most steps: {max(r[3] for r in rows)} (goal <= 12): {'met' if max(r[3] for r in rows) <= 12 else 'not met'}")
PY
