# Shared by bench/floor.sh, bench/generator.sh and
# bench/generator-profile.sh (sourced, not run): one standalone zero-work
# push hop checked with nghttp, on top of bench/lib/steps.sh (steps run by
# PID, everything stopped at exit).
#
# The sourcing script sets BENCH (its name, for messages) and REPO, and
# calls bench_setup once; then start_hop, check_hop, stop_hop.

HOP_PID=""   # the standalone hop
HOP_NAME="floor"

# shellcheck source=bench/lib/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

stop_hop() {
    if [[ -n $HOP_PID ]]; then
        kill -TERM "$HOP_PID" 2>/dev/null
        wait_gone "$HOP_PID" 50 || kill -KILL "$HOP_PID" 2>/dev/null
        wait "$HOP_PID" 2>/dev/null
        HOP_PID=""
    fi
    # The write end of the hop's stdin: closing it is its last-resort stop.
    exec 4>&-
    return 0
}

# Checks the tools, installs the traps, makes TMP, builds the release binary.
bench_setup() {
    local tool
    for tool in h2load nghttp; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            say "$tool not found; install it with: apt-get install nghttp2-client"
            exit 1
        fi
    done
    for tool in cargo python3; do
        command -v "$tool" >/dev/null 2>&1 || { say "$tool not found"; exit 1; }
    done
    STEPS_STOP=stop_hop
    steps_traps
    PY="$REPO/bench/floor.py"
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
    cd "$REPO"
    release_binary
    python3 "$PY" body "$TMP/body.bin"
    GRPC_HEADERS=(-H 'content-type: application/grpc' -H 'te: trailers')
}

# Starts one zero-work push hop (a current-thread runtime, as in a run) on
# a loopback port; sets HOP_PID, ADDR and URL.
start_hop() {
    cat >"$TMP/hop.json" <<JSON
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
JSON
    # Its stdin is a fifo whose only writer is this shell (fd 4): the hop sees
    # EOF and exits even if this script is killed with SIGKILL. It runs in its
    # own session (setsid execs in place: $! is the hop), so a Ctrl-C reaches
    # only this script, whose trap stops the hop by its PID.
    rm -f "$TMP/hop.stdin" "$TMP/hop.addr"
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
        say "the hop did not start; its log:"
        cat "$TMP/hop.log" >&2
        exit 1
    fi
    if [[ "$(cat "/proc/$HOP_PID/comm" 2>/dev/null)" != tailmesh ]]; then
        say "pid $HOP_PID is not the hop"
        exit 1
    fi
    ADDR="$(head -n1 "$TMP/hop.addr")"
    case "$ADDR" in
        127.0.0.1:*) ;;
        *) say "the hop listens on '$ADDR', not loopback"; exit 1 ;;
    esac
    URL="http://$ADDR/tailmesh.v1.Hop/Call"
    say "hop (pid $HOP_PID) on $ADDR"
}

# One call by nghttp first: the reply must decode as the CallReply to our
# request and end with grpc-status 0 (HTTP 200 alone proves nothing).
check_hop() {
    step TERM nghttp -v -d "$TMP/body.bin" "${GRPC_HEADERS[@]}" "$URL" >"$TMP/nghttp-v.txt" 2>&1 || true
    if ! grep -q 'grpc-status: 0' "$TMP/nghttp-v.txt"; then
        say "the hop's reply does not end with grpc-status 0:"
        cat "$TMP/nghttp-v.txt" >&2
        exit 1
    fi
    step TERM nghttp -d "$TMP/body.bin" "${GRPC_HEADERS[@]}" "$URL" >"$TMP/reply.bin"
    local bytes
    bytes="$(python3 "$PY" check-reply "$TMP/reply.bin" "$HOP_NAME")"
    say "one reply checked by nghttp: $bytes bytes, request id, payload and path echoed"
}
