#!/usr/bin/env bash
# tailmesh's load generator against h2load, side by side in one run, with
# a lean HTTP/2 client as the third tool: all drive the same standalone
# zero-work push hop, closed loop, with 1, 64 and 128 requests in flight,
# the tools taken in turn for each level in each round (which goes first
# rotates from round to round). Each tool's rate over h2load's is read
# within each round and printed as a median over the rounds with a
# bootstrap 95 % interval, beside the CPU steal and load average during the
# rounds; the goal, tailmesh at least 0.9x h2load's rate, is met at a level
# when the interval's lower bound is at least 0.9, not met when its upper
# bound is below, undecided otherwise.
#
#   h2load:   1 in flight: -c 1 -m 1; N in flight: -c 4 -m N/4
#   tailmesh: tailmesh load --concurrency N --connections (1 or 4), the
#             generator of `tailmesh run` (closed loop, latency from each
#             request's send time, every request accounted for)
#   h2lean:   the lean client (bench/src/h2lean.rs: the wire written by
#             hand, no h2 crate), -c and -m as h2load's
#
# Usage: bench/generator.sh [-n REQUESTS] [-r ROUNDS] [--no-lean] [--json FILE]
#   -n N         requests per measurement (default 50000)
#   -r R         rounds (default 10); the tables show medians
#   --no-lean    h2load and tailmesh only (no h2lean build)
#   --json FILE  also write every measurement as JSON
#
# Needs cargo, python3, and h2load + nghttp (Debian: nghttp2-client).
# Measures the release build of this checkout, or the binary TAILMESH_BIN
# names (another commit's, for a before/after: one run with each).
# Loopback only. Leaves nothing behind: every process it starts is stopped
# by its PID and the temp dir removed, on every exit path (Ctrl-C included).
set -euo pipefail

BENCH=generator
REQUESTS=50000
ROUNDS=10
JSON_OUT=""
LEAN=1
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --no-lean) LEAN=0; shift ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$REQUESTS" "$ROUNDS"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -n and -r want positive integers, got '$v'" >&2
        exit 2
    fi
done
if [[ -n $JSON_OUT ]]; then
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/standalone-hop.sh
source "$HERE/lib/standalone-hop.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
bench_setup
rounds_setup
if ((LEAN)); then
    say "cargo build --release -p tailmesh-bench --bin h2lean"
    step TERM cargo build --release -p tailmesh-bench --bin h2lean --quiet
    LEAN_BIN="$REPO/target/release/h2lean"
fi
start_hop
check_hop

run_h2load() { # in_flight round
    local n=$1 r=$2 c=4
    ((n >= 4)) || c=1
    local out="$TMP/h2load-$n-$r"
    say "round $r: h2load -n $REQUESTS -c $c -m $((n / c)) -t 1"
    step TERM h2load -n "$REQUESTS" -c "$c" -m "$((n / c))" -t 1 -d "$TMP/body.bin" \
        "${GRPC_HEADERS[@]}" --log-file "$out.log" "$URL" >"$out.txt" 2>&1 || {
        say "h2load failed:"
        cat "$out.txt" >&2
        exit 1
    }
    python3 "$PY" h2load "$out.txt" "$out.log" "$REQUESTS" "$HOP_NAME" "$out.json"
    rm -f "$out.log"
}

run_tailmesh() { # in_flight round
    local n=$1 r=$2 c=4
    ((n >= 4)) || c=1
    local out="$TMP/tailmesh-$n-$r"
    say "round $r: tailmesh load --concurrency $n --connections $c --requests $REQUESTS"
    # A long deadline: h2load and h2lean wait as long as an answer takes,
    # and on a busy machine the 1 s default fails a few requests, and so
    # the whole measurement.
    step TERM "$BIN" load "$ADDR" --concurrency "$n" --connections "$c" --requests "$REQUESTS" \
        --warmup 0s --timeout 30s >"$out.raw" 2>"$out.err" || {
        say "tailmesh load failed:"
        cat "$out.err" >&2
        exit 1
    }
    python3 "$PY" load "$out.raw" "$REQUESTS" "$out.json"
}

run_h2lean() { # in_flight round
    local n=$1 r=$2 c=4
    ((n >= 4)) || c=1
    local out="$TMP/h2lean-$n-$r"
    say "round $r: h2lean -n $REQUESTS -c $c -m $((n / c))"
    step TERM "$LEAN_BIN" "$ADDR" -n "$REQUESTS" -c "$c" -m "$((n / c))" >"$out.raw" 2>"$out.err" || {
        say "h2lean failed:"
        cat "$out.err" >&2
        exit 1
    }
    python3 "$PY" lean "$out.raw" "$REQUESTS" "$out.json"
}

TOOLS=(h2load tailmesh)
((LEAN)) && TOOLS+=(h2lean)
machine_mark
for ((r = 1; r <= ROUNDS; r++)); do
    for n in 1 64 128; do
        # Round r starts with tool (r - 1) mod the number of tools.
        for ((i = 0; i < ${#TOOLS[@]}; i++)); do
            "run_${TOOLS[(r - 1 + i) % ${#TOOLS[@]}]}" "$n" "$r"
        done
    done
    python3 "$PY" generator-round "$TMP" "$r" "$TMP/round.tsv"
    round_values "$TMP/round.tsv"
    machine_mark
done
stop_hop

goals=()
for n in 1 64 128; do
    goals+=(--goal "tailmesh load / h2load rate, $n in flight>=0.9")
done
rounds_report "${goals[@]}" >"$TMP/intervals.txt"
echo
echo "load generators vs h2load: one zero-work hop, $REQUESTS requests each, $ROUNDS rounds (medians), 64-byte payload, $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 "$PY" generator-report "$TMP" "$ROUNDS" ${JSON_OUT:+"$JSON_OUT"}
echo
cat "$TMP/intervals.txt"
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
