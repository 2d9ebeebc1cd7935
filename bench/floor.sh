#!/usr/bin/env bash
# The per-hop cost of a zero-work push hop against the gRPC floor, measured
# side by side in one run:
#
#   1. h2load -> one zero-work hop, 1 in flight (the gRPC floor);
#   2. tailmesh's load generator -> the same kind of hop (1-hop chain);
#   3. tailmesh -> a 3-hop chain; per-hop cost = (3-hop p50 - 1-hop p50) / 2.
#
# Steps 2 and 3 run twice: with traces off (--no-traces: what a hop itself
# costs) and on (every span exported), reported apart.
#
# Usage: bench/floor.sh [-n REQUESTS] [--json FILE]
#   -n N         requests per measurement (default 20000; e.g. -n 2000 for a
#                quick run)
#   --json FILE  also write the numbers as JSON
#
# Needs cargo, python3, and h2load + nghttp (Debian: nghttp2-client).
# Loopback only. Leaves nothing behind: every process it starts is stopped
# by its PID and the temp dir removed, on every exit path (Ctrl-C included).
set -euo pipefail

REQUESTS=20000
JSON_OUT=""
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "floor: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if ! [[ $REQUESTS =~ ^[1-9][0-9]*$ ]]; then
    echo "floor: -n wants a positive integer, got '$REQUESTS'" >&2
    exit 2
fi
if [[ -n $JSON_OUT ]]; then
    # Resolve before we cd.
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
BENCH=floor
# shellcheck source=bench/lib/standalone-hop.sh
source "$HERE/lib/standalone-hop.sh"

# --- 1. build; 2. one zero-work push hop, checked by nghttp ------------------------

bench_setup
start_hop
check_hop

# --- 3. h2load, 1 in flight ------------------------------------------------------

H2LOAD=(h2load -c 1 -m 1 -t 1 -d "$TMP/body.bin" "${GRPC_HEADERS[@]}")
# Warm up for 1 s, as tailmesh's scenarios below do (a separate connection).
echo "floor: h2load warmup 1s" >&2
step TERM "${H2LOAD[@]}" -D 1 "$URL" >"$TMP/h2load-warmup.txt" 2>&1
echo "floor: h2load -n $REQUESTS -c 1 -m 1 -t 1 $URL" >&2
step TERM "${H2LOAD[@]}" -n "$REQUESTS" --log-file "$TMP/h2load.log" "$URL" >"$TMP/h2load.txt" 2>&1 || {
    echo "floor: h2load failed:" >&2
    cat "$TMP/h2load.txt" >&2
    exit 1
}
python3 "$PY" h2load "$TMP/h2load.txt" "$TMP/h2load.log" "$REQUESTS" "$HOP_NAME" "$TMP/h2load.json"

# The hop is no longer needed: stop it now so it does not share the cores
# with tailmesh's own hops.
stop_hop

# --- 4. tailmesh: 1-hop and 3-hop zero-work push chains ---------------------------

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

# Traces off (what a hop itself costs), then on (every span exported to
# the run's receiver): the two are reported apart.
for traces in off on; do
    flags=()
    [[ $traces == off ]] && flags=(--no-traces)
    for chain in 1 3; do
        name="floor-${chain}hop"
        say "tailmesh run $name, traces $traces ($REQUESTS requests)"
        if ! step INT "$BIN" run "$TMP/$name.toml" --results "$TMP/results" --quiet "${flags[@]}" \
            >"$TMP/$name.out" 2>&1; then
            say "tailmesh run $name failed:"
            cat "$TMP/$name.out" >&2
            exit 1
        fi
        python3 "$PY" tailmesh "$TMP/results/$name/latest/summary.json" "$REQUESTS" \
            "$TMP/t$chain-$traces.json"
    done
done

# --- 5. the table --------------------------------------------------------------------

echo
echo "zero-work push hop vs the gRPC floor: $REQUESTS requests each, 1 in flight, 64-byte payload, $(nproc) cores"
python3 "$PY" report "$TMP" ${JSON_OUT:+"$JSON_OUT"}
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
