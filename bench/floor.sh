#!/usr/bin/env bash
# The per-hop cost of a zero-work push hop against the gRPC floor, measured
# side by side in one run:
#
#   1. h2load -> one zero-work hop, 1 in flight (the gRPC floor);
#   2. tailmesh's load generator -> the same kind of hop (1-hop chain);
#   3. tailmesh -> a 3-hop chain; per-hop cost = (3-hop p50 - 1-hop p50) / 2.
#
# Steps 2 and 3 run twice: with traces off (--no-traces: what a hop itself
# costs) and on (every span exported), reported apart. Each round measures
# all five once, in turn (h2load, 1-hop off, 3-hop off, 1-hop on, 3-hop on);
# the ratios to h2load are read within each round and printed as medians
# over the rounds with bootstrap 95 % intervals, beside the CPU steal and
# load average during the rounds. The goal, per-hop cost at most 2.5x
# h2load's p50 with traces off, is met when the interval's upper bound is
# at most 2.5, not met when its lower bound is above, undecided otherwise.
#
# Usage: bench/floor.sh [-n REQUESTS] [-r ROUNDS] [--json FILE]
#   -n N         requests per measurement (default 20000; e.g. -n 2000 for a
#                quick run)
#   -r R         rounds (default 10)
#   --json FILE  also write the numbers as JSON
#
# Needs cargo, python3, and h2load + nghttp (Debian: nghttp2-client).
# Measures the release build of this checkout, or the binary TAILMESH_BIN
# names (another commit's, for a before/after: one run with each).
# Loopback only. Leaves nothing behind: every process it starts is stopped
# by its PID and the temp dir removed, on every exit path (Ctrl-C included).
set -euo pipefail

REQUESTS=20000
ROUNDS=10
JSON_OUT=""
usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "floor: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$REQUESTS" "$ROUNDS"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "floor: -n and -r want positive integers, got '$v'" >&2
        exit 2
    fi
done
if [[ -n $JSON_OUT ]]; then
    # Resolve before we cd.
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
BENCH=floor
# shellcheck source=bench/lib/standalone-hop.sh
source "$HERE/lib/standalone-hop.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
# The ratio the goal is on; floor.py's floor-round names it so.
GOAL_RATIO="per-hop cost / h2load p50, traces off"

# --- 1. build; 2. one zero-work push hop, checked by nghttp ------------------------

bench_setup
rounds_setup
start_hop
check_hop

# --- 3. the chains tailmesh runs --------------------------------------------------

scenario() { # name hops...
    local name=$1
    shift
    {
        echo "name = \"$name\""
        echo "description = \"zero-work push chain of $# hop(s), 1 in flight (bench/floor.sh)\""
        echo "seed = 1"
        echo
        echo "[load]"
        echo "mode = \"closed\""
        echo "concurrency = 1"
        echo "requests = $REQUESTS"
        echo "warmup = \"1s\""
        echo "timeout = \"1s\""
        echo "payload = 64"
        local hop
        for hop in "$@"; do
            echo
            echo "[[hop]]"
            echo "name = \"$hop\""
            echo "transport = \"push\""
            echo "work = { kind = \"none\" }"
        done
    } >"$TMP/$name.toml"
}
scenario floor-1hop a
scenario floor-3hop a b c

H2LOAD=(h2load -c 1 -m 1 -t 1 -d "$TMP/body.bin" "${GRPC_HEADERS[@]}")

run_h2load() { # round
    local r=$1
    # Warm up for 1 s, as tailmesh's scenarios do (a separate connection).
    step TERM "${H2LOAD[@]}" -D 1 "$URL" >"$TMP/h2load-warmup.txt" 2>&1
    say "round $r: h2load -n $REQUESTS -c 1 -m 1 -t 1 $URL"
    # h2load appends to its log file: each round starts a new one.
    rm -f "$TMP/h2load.log"
    step TERM "${H2LOAD[@]}" -n "$REQUESTS" --log-file "$TMP/h2load.log" "$URL" >"$TMP/h2load.txt" 2>&1 || {
        say "h2load failed:"
        cat "$TMP/h2load.txt" >&2
        exit 1
    }
    python3 "$PY" h2load "$TMP/h2load.txt" "$TMP/h2load.log" "$REQUESTS" "$HOP_NAME" "$TMP/h2load-$r.json"
}

run_tailmesh() { # chain traces round
    local chain=$1 traces=$2 r=$3 name="floor-$1hop" flags=()
    # Traces off is what a hop itself costs; on, every span is exported to
    # the run's receiver: the two are reported apart.
    [[ $traces == off ]] && flags=(--no-traces)
    say "round $r: tailmesh run $name, traces $traces ($REQUESTS requests)"
    if ! step INT "$BIN" run "$TMP/$name.toml" --results "$TMP/results" --quiet "${flags[@]}" \
        >"$TMP/$name.out" 2>&1; then
        say "tailmesh run $name failed:"
        cat "$TMP/$name.out" >&2
        exit 1
    fi
    python3 "$PY" tailmesh "$TMP/results/$name/latest/summary.json" "$REQUESTS" \
        "$TMP/t$chain-$traces-$r.json"
    rm -rf "$TMP/results/$name"
}

# --- 4. rounds: h2load, then tailmesh's four runs, each round --------------------
#
# The standalone hop stays up through the tailmesh runs: idle, it waits in
# epoll and takes no CPU from their hops.

machine_mark
for ((r = 1; r <= ROUNDS; r++)); do
    run_h2load "$r"
    for traces in off on; do
        for chain in 1 3; do
            run_tailmesh "$chain" "$traces" "$r"
        done
    done
    python3 "$PY" floor-round "$TMP" "$r" "$TMP/round.tsv"
    round_values "$TMP/round.tsv"
    machine_mark
done
stop_hop

# --- 5. the tables ---------------------------------------------------------------

rounds_report --goal "$GOAL_RATIO<=2.5" >"$TMP/intervals.txt"
echo
echo "zero-work push hop vs the gRPC floor: $REQUESTS requests each, $ROUNDS rounds (medians), 1 in flight, 64-byte payload, $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 "$PY" report "$TMP" "$ROUNDS" ${JSON_OUT:+"$JSON_OUT"}
echo
cat "$TMP/intervals.txt"
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
