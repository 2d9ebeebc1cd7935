#!/usr/bin/env bash
# The hops' precise timer: each runtime's own alarm (the default) against
# the process's shared timer thread (TAILMESH_TIMER=shared), on
# bench/generators.toml (or SCENARIO): a 3-hop chain whose work is sleeps
# (exponential, mean 300 us), one load generator, far from saturation.
# Each round runs both, in turn (which goes first alternates), with the
# same seed, so every hop sleeps the same planned times in both; prints
# the medians over the rounds, with bootstrap 95 % intervals, of
# - the end-to-end p50 and p99, own alarm / shared thread;
# - how much longer the last hop's sleeps took (mean of its service time,
#   own alarm - shared thread, us; the planned sleeps are the same, so this
#   is the difference of the timers' lateness);
# - the hops' CPU per request, own alarm / shared thread;
# and the machine's steal and load average over the rounds.
#
# Usage: bench/hop-timer.sh [-r ROUNDS] [SCENARIO]
#   -r R   rounds (default 10)
#
# Uses a release build, or the binary TAILMESH_BIN names. Loopback only.
# Leaves nothing behind: every run is stopped by its PID (it stops its own
# hops) and the temp dir removed, on every exit path.
set -euo pipefail

BENCH=hop-timer
ROUNDS=10
positional=()
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
        *) positional+=("$1"); shift ;;
    esac
done
((${#positional[@]} <= 1)) || { usage >&2; exit 2; }
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then
    echo "$BENCH: -r wants a positive integer, got '$ROUNDS'" >&2
    exit 2
fi
SCENARIO="${positional[0]:-}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
scenario_setup "$HERE/generators.toml"

release_binary
rounds_setup
busy_gate 0

measure() { # timer round; writes $TMP/$timer-$round.json
    local timer=$1 r=$2
    say "round $r: $timer"
    if ! TAILMESH_TIMER="$timer" step INT "$BIN" run "$SCENARIO" --results "$TMP/results" \
        --quiet --no-traces >"$TMP/run.out" 2>&1; then
        say "tailmesh run failed:"
        cat "$TMP/run.out" >&2
        exit 1
    fi
    python3 - "$TMP/results" "$TMP/$timer-$r.json" <<'PY'
import csv, json, pathlib, sys
run = next(pathlib.Path(sys.argv[1]).glob("*/latest"))
v = json.load(open(run / "summary.json"))["variants"][0]
if v["ok"] != v["sent"]:
    sys.exit(f"hop-timer: {v['sent'] - v['ok']} of {v['sent']} request(s) failed")
# Each hop process's CPU at its last sample.
cpu = {}
for row in csv.DictReader(open(run / "processes.csv")):
    if row["process"].startswith("hop-"):
        cpu[row["process"]] = float(row["cpu_s"])
json.dump({"p50_us": v["latency"]["p50_us"], "p99_us": v["latency"]["p99_us"],
           "leaf_service_mean_us": v["hops"][-1]["service"]["mean_us"],
           "hop_cpu_us_per_request": 1e6 * sum(cpu.values()) / v["sent"]},
          open(sys.argv[2], "w"))
PY
    rm -rf "$TMP/results"
}

machine_mark
run_runtime() { measure runtime "$r"; }
run_shared() { measure shared "$r"; }
for ((r = 1; r <= ROUNDS; r++)); do
    in_turn "$r" run_runtime run_shared
    python3 - "$TMP/runtime-$r.json" "$TMP/shared-$r.json" >"$TMP/round.tsv" <<'PY'
import json, sys
own, shared = (json.load(open(f)) for f in sys.argv[1:3])
print(f"p50 own / shared\t{own['p50_us'] / shared['p50_us']:.4f}")
print(f"p99 own / shared\t{own['p99_us'] / shared['p99_us']:.4f}")
print(f"last hop's sleeps own - shared, us\t{own['leaf_service_mean_us'] - shared['leaf_service_mean_us']:.2f}")
print(f"hop CPU a request own / shared\t{own['hop_cpu_us_per_request'] / shared['hop_cpu_us_per_request']:.4f}")
print(f"hop CPU a request shared, us\t{shared['hop_cpu_us_per_request']:.1f}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done

echo
echo "the hops' own alarm against the shared timer thread: $(basename "$SCENARIO"), $ROUNDS rounds, $(nproc) cores, $(date -u +%Y-%m-%d)"
rounds_report
exit 0
