#!/usr/bin/env bash
# The serving-thread span path alone (bench/src/bin/span_path.rs): per
# request, a hop's server span, a client span under it and the
# `traceparent` it writes, done on one thread with no mesh around it,
# untraced then traced in each round. Prints the medians over the rounds
# with bootstrap 95 % intervals of the traced path's nanoseconds per
# request above the untraced one's, and of their ratio. A change to the
# span path worth a few hundred nanoseconds a request is lost in a whole
# mesh's noise (bench/tracing.sh); here it shows.
#
# Usage: bench/span-path.sh [-r ROUNDS] [-n REQUESTS]
#   -r R   rounds (default 10)
#   -n N   requests per measurement (default 1000000)
#
# Measures the release build of this checkout, or the binary SPAN_PATH_BIN
# names (another commit's, for a before/after: one run with each). Starts
# no server and opens no socket; each measurement is one process that
# ends by itself.
set -euo pipefail

BENCH=span-path
ROUNDS=10
REQUESTS=1000000
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$ROUNDS" "$REQUESTS"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -r and -n want positive integers, got '$v'" >&2
        exit 2
    fi
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
steps_traps
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"

if [[ -n ${SPAN_PATH_BIN:-} ]]; then
    [[ -x $SPAN_PATH_BIN ]] || { say "SPAN_PATH_BIN=$SPAN_PATH_BIN is not an executable"; exit 2; }
    BIN="$SPAN_PATH_BIN"
    say "measuring $BIN (SPAN_PATH_BIN)"
else
    say "cargo build --release -p tailmesh-bench --bin span_path"
    step TERM cargo build --manifest-path "$REPO/Cargo.toml" --release --quiet \
        -p tailmesh-bench --bin span_path
    BIN="$REPO/target/release/span_path"
fi
rounds_setup
busy_gate 0

measure() { # FLAGS...: ns per request
    local out
    out="$TMP/measure.out"
    if ! step TERM "$BIN" --requests "$REQUESTS" "$@" >"$out"; then
        say "span_path $* failed"
        exit 1
    fi
    cat "$out"
}

machine_mark
for ((r = 1; r <= ROUNDS; r++)); do
    off="$(measure)"
    on="$(measure --traced)"
    say "round $r: untraced $off ns, traced $on ns per request"
    python3 - "$off" "$on" >"$TMP/round.tsv" <<'PY'
import sys
off, on = (float(x) for x in sys.argv[1:3])
print(f"traced - untraced (ns per request)\t{on - off!r}")
print(f"traced / untraced\t{on / off!r}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done

echo
echo "the span path of one hop, $REQUESTS requests per measurement, $ROUNDS rounds, $(nproc) cores, $(date -u +%Y-%m-%d)"
rounds_report
