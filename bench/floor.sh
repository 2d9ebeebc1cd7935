#!/usr/bin/env bash
# The per-hop cost of a zero-work push hop against the gRPC floor, measured
# side by side in one run:
#
#   1. h2load -> one zero-work hop, 1 in flight (the gRPC floor);
#   2. tailmesh's load generator -> the same kind of hop (1-hop chain);
#   3. tailmesh -> a 3-hop chain; per-hop cost = (3-hop p50 - 1-hop p50) / 2.
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
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
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

for tool in h2load nghttp; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "floor: $tool not found; install it with: apt-get install nghttp2-client" >&2
        exit 1
    fi
done
for tool in cargo python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "floor: $tool not found" >&2; exit 1; }
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PY="$HERE/floor.py"
BIN="$REPO/target/release/tailmesh"
HOP_NAME="floor"

# --- cleanup: only the PIDs started here --------------------------------------

TMP=""
HOP_PID=""   # the standalone hop
CUR_PID=""   # the foreground step (cargo, h2load, nghttp, tailmesh run)
CUR_SIG="TERM"

# Waits up to $2 tenths of a second for PID $1 to exit; 0 when it did.
wait_gone() {
    local pid=$1 tenths=$2
    while ((tenths-- > 0)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    ! kill -0 "$pid" 2>/dev/null
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    if [[ -n $CUR_PID ]]; then
        # tailmesh run stops its own hops on SIGINT (Ctrl-C); the others on TERM.
        kill "-$CUR_SIG" "$CUR_PID" 2>/dev/null
        wait_gone "$CUR_PID" 100 || kill -KILL "$CUR_PID" 2>/dev/null
        wait "$CUR_PID" 2>/dev/null
    fi
    if [[ -n $HOP_PID ]]; then
        kill -TERM "$HOP_PID" 2>/dev/null
        wait_gone "$HOP_PID" 50 || kill -KILL "$HOP_PID" 2>/dev/null
        wait "$HOP_PID" 2>/dev/null
    fi
    # The write end of the hop's stdin: closing it is its last-resort stop.
    exec 4>&-
    [[ -n $TMP ]] && rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Runs one step in the background and waits for it, so a signal reaches the
# traps at once and the step is stopped by its PID. $1: the signal that stops
# it gracefully; the rest: the command. Returns its status.
step() {
    CUR_SIG=$1
    shift
    "$@" 4>&- &
    CUR_PID=$!
    local rc=0
    wait "$CUR_PID" || rc=$?
    CUR_PID=""
    # A child that stopped on Ctrl-C (tailmesh run exits 130): we were
    # interrupted too.
    ((rc != 130)) || exit 130
    return "$rc"
}

TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-floor.XXXXXX")"
cd "$REPO"

# --- 1. build ------------------------------------------------------------------

echo "floor: cargo build --release -p tailmesh" >&2
step TERM cargo build --release -p tailmesh --quiet

# --- 2. one zero-work push hop -----------------------------------------------------

cat >"$TMP/hop.json" <<EOF
{
  "behavior": {
    "name": "$HOP_NAME",
    "seed": 1,
    "work": { "kind": "none" },
    "slow": null,
    "replica_slow": null,
    "error": null
  },
  "replica": 0,
  "transport": "push",
  "downstream": []
}
EOF
# Its stdin is a fifo whose only writer is this shell (fd 4): the hop sees
# EOF and exits even if this script is killed with SIGKILL. It runs in its
# own session (setsid execs in place: $! is the hop), so a Ctrl-C reaches
# only this script, whose trap stops the hop by its PID.
mkfifo "$TMP/hop.stdin"
exec 3<>"$TMP/hop.stdin"   # read-write, so the opens below do not block
setsid "$BIN" hop --config "$TMP/hop.json" --listen 127.0.0.1:0 --addr-file "$TMP/hop.addr" \
    --supervised <"$TMP/hop.stdin" >"$TMP/hop.log" 2>&1 3>&- &
HOP_PID=$!
exec 4>"$TMP/hop.stdin"
exec 3>&-

for _ in $(seq 100); do
    [[ -s $TMP/hop.addr ]] && break
    kill -0 "$HOP_PID" 2>/dev/null || break
    sleep 0.1
done
if ! [[ -s $TMP/hop.addr ]]; then
    echo "floor: the hop did not start; its log:" >&2
    cat "$TMP/hop.log" >&2
    exit 1
fi
if [[ "$(cat "/proc/$HOP_PID/comm" 2>/dev/null)" != tailmesh ]]; then
    echo "floor: pid $HOP_PID is not the hop" >&2
    exit 1
fi
ADDR="$(head -n1 "$TMP/hop.addr")"
case "$ADDR" in
    127.0.0.1:*) ;;
    *) echo "floor: the hop listens on '$ADDR', not loopback" >&2; exit 1 ;;
esac
URL="http://$ADDR/tailmesh.v1.Hop/Call"
echo "floor: hop (pid $HOP_PID) on $ADDR" >&2

# --- 3. h2load, 1 in flight ------------------------------------------------------

python3 "$PY" body "$TMP/body.bin"
GRPC_HEADERS=(-H 'content-type: application/grpc' -H 'te: trailers')

# One call by nghttp first: the reply must decode as the CallReply to our
# request and end with grpc-status 0 (HTTP 200 alone proves nothing).
step TERM nghttp -v -d "$TMP/body.bin" "${GRPC_HEADERS[@]}" "$URL" >"$TMP/nghttp-v.txt" 2>&1 || true
if ! grep -q 'grpc-status: 0' "$TMP/nghttp-v.txt"; then
    echo "floor: the hop's reply does not end with grpc-status 0:" >&2
    cat "$TMP/nghttp-v.txt" >&2
    exit 1
fi
step TERM nghttp -d "$TMP/body.bin" "${GRPC_HEADERS[@]}" "$URL" >"$TMP/reply.bin"
REPLY_BYTES="$(python3 "$PY" check-reply "$TMP/reply.bin" "$HOP_NAME")"
echo "floor: one reply checked by nghttp: $REPLY_BYTES bytes, request id, payload and path echoed" >&2

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
kill -TERM "$HOP_PID" 2>/dev/null || true
wait_gone "$HOP_PID" 50 || kill -KILL "$HOP_PID" 2>/dev/null || true
wait "$HOP_PID" 2>/dev/null || true
HOP_PID=""
exec 4>&-

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

for chain in 1 3; do
    name="floor-${chain}hop"
    echo "floor: tailmesh run $name ($REQUESTS requests)" >&2
    if ! step INT "$BIN" run "$TMP/$name.toml" --results "$TMP/results" --quiet \
        >"$TMP/$name.out" 2>&1; then
        echo "floor: tailmesh run $name failed:" >&2
        cat "$TMP/$name.out" >&2
        exit 1
    fi
    python3 "$PY" tailmesh "$TMP/results/$name/latest/summary.json" "$REQUESTS" "$TMP/t$chain.json"
done

# --- 5. the table --------------------------------------------------------------------

echo
echo "zero-work push hop vs the gRPC floor: $REQUESTS requests each, 1 in flight, 64-byte payload, $(nproc) cores"
python3 "$PY" report "$TMP" ${JSON_OUT:+"$JSON_OUT"}
[[ -n $JSON_OUT ]] && echo "floor: wrote $JSON_OUT" >&2
exit 0
