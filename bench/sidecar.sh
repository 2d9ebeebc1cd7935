#!/usr/bin/env bash
# What a real service's sidecar costs per call, against tailmesh's own
# zero-work forwarding hop, measured side by side in one `tailmesh run` of
# bench/sidecar.toml (closed loop, 1 in flight, traces off), three variants
# of one chain, load -> a -> b -> svc:
#
#   1. zero:    svc is a zero-work hop. Forwarding hop's cost = (the entry
#               hop's total p50 - the leaf's total p50) / 2: what a and b
#               add (floor.sh's (3-hop p50 - 1-hop p50) / 2, read inside
#               one chain);
#   2. sidecar: svc is the C++ example server behind its tailmesh sidecar;
#   3. direct:  b calls the same server itself (`[hop.service] direct`);
#   4. tonic-plain:  b calls the Rust tonic echo (examples/tonic-echo,
#               --plain) itself;
#   5. tonic-layers: the same server inside tailmesh's serving layers
#               (`[hop.service] layers = true`), called by b itself.
#
# Layers' cost = tonic-layers p50 - tonic-plain p50, the same way; the
# goal is at most 0.5x the sidecar's cost ("tailmesh layers / sidecar").
#
# Sidecar's cost = sidecar p50 - direct p50: the same client (b's) calls
# the same server, with and without the sidecar between. The goal is at
# most 1.2x the forwarding hop's cost. Each round is one run of the three
# variants in turn; the ratio is read within each round and printed as a
# median over the rounds with a bootstrap 95 % interval, beside the CPU
# steal and load average during the rounds: the goal is met when the
# interval's upper bound is at most 1.2, not met when its lower bound is
# above, undecided otherwise.
#
# The service is the C++ example (examples/servers/cpp, gRPC C++'s
# synchronous server): compiled, no interpreter or garbage collector, so
# its own time is short and steady and the difference is the sidecar's.
#
# Usage: bench/sidecar.sh [-n N] [-r R] [--bin TAILMESH] [--strict] [--no-direct] [--no-layers] [--json FILE]
#   -n N          requests per variant (default 20000; -n 2000 for a quick run)
#   -r R          rounds: runs of the five variants (default 10)
#   --bin PATH    the tailmesh binary to measure (default: build the release
#                 one); for an A/B of two builds, run once with each
#   --strict      refuse to run when the 1-minute load average is over 1.5
#                 (default: warn)
#   --no-direct   leave the direct variant out (a build without
#                 `[hop.service] direct`): no sidecar cost then, only the
#                 sidecar chain's p50 over the zero-work chain's
#   --no-layers   leave the two tonic variants out (a build without
#                 `[hop.service] layers`)
#   --json FILE   also write the numbers as JSON
#
# Needs cargo, python3 and the C++ example server (examples/servers/setup.sh
# cpp); builds the tonic echo (release) unless --no-layers. Loopback only.
# Leaves nothing behind: the run is stopped by its PID (it stops its own
# hops and services) and the temp dir removed, on every exit path (Ctrl-C
# included).
set -euo pipefail

REQUESTS=20000
ROUNDS=10
BIN=""
STRICT=0
NO_DIRECT=0
NO_LAYERS=0
JSON_OUT=""
usage() { sed -n '2,51p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --bin) BIN="${2:?--bin needs a path}"; shift 2 ;;
        --strict) STRICT=1; shift ;;
        --no-direct) NO_DIRECT=1; shift ;;
        --no-layers) NO_LAYERS=1; shift ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "sidecar: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for value in "$REQUESTS" "$ROUNDS"; do
    if ! [[ $value =~ ^[1-9][0-9]*$ ]]; then
        echo "sidecar: -n and -r want a positive integer, got '$value'" >&2
        exit 2
    fi
done
if [[ -n $JSON_OUT ]]; then
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi
if [[ -n $BIN ]]; then
    [[ -x $BIN ]] || { echo "sidecar: --bin $BIN is not an executable" >&2; exit 2; }
    BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PY="$HERE/sidecar.py"
SERVER="$REPO/examples/servers/cpp/build/echo-server"
BENCH=sidecar
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
steps_traps

for tool in python3; do
    command -v "$tool" >/dev/null 2>&1 || { say "$tool not found"; exit 1; }
done
if [[ ! -x $SERVER ]]; then
    say "the C++ example server is not built ($SERVER); run: examples/servers/setup.sh cpp"
    exit 1
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-sidecar.XXXXXX")"

if [[ -z $BIN ]]; then
    command -v cargo >/dev/null 2>&1 || { say "cargo not found"; exit 1; }
    say "building the release binary"
    step TERM cargo build --manifest-path "$REPO/Cargo.toml" --release --locked -q -p tailmesh --bin tailmesh
    BIN="$REPO/target/release/tailmesh"
fi
command -v cargo >/dev/null 2>&1 || { say "cargo not found (it builds the intervals binary)"; exit 1; }
if ! ((NO_LAYERS)); then
    say "building the tonic echo (release)"
    step TERM cargo build --manifest-path "$REPO/Cargo.toml" --release --locked -q -p tailmesh-example-echo
fi
rounds_setup

busy_gate "$STRICT"

flags=()
((NO_DIRECT)) && flags+=(--no-direct)
((NO_LAYERS)) && flags+=(--no-layers)
python3 "$PY" scenario "$HERE/sidecar.toml" "$REQUESTS" "$TMP/sidecar.toml" "${flags[@]}"
machine_mark
for ((round = 1; round <= ROUNDS; round++)); do
    say "round $round of $ROUNDS: tailmesh run sidecar ($REQUESTS requests per variant)"
    if ! step INT "$BIN" run "$TMP/sidecar.toml" --results "$TMP/results" --quiet --no-traces \
        >"$TMP/run-$round.out" 2>&1; then
        say "tailmesh run failed:"
        cat "$TMP/run-$round.out" >&2
        exit 1
    fi
    python3 "$PY" round "$TMP/results/sidecar/latest/summary.json" "$REQUESTS" "$TMP/round-$round.json" \
        "$TMP/round.tsv"
    rm -rf "$TMP/results"
    round_values "$TMP/round.tsv"
    machine_mark
done

goals=()
((NO_DIRECT)) || goals=(--goal "sidecar / forwarding hop<=1.2")
((NO_DIRECT || NO_LAYERS)) || goals+=(--goal "tailmesh layers / sidecar<=0.5")
rounds_report "${goals[@]}" >"$TMP/intervals.txt"
echo
echo "sidecar vs zero-work forwarding hop: $REQUESTS requests per variant, $ROUNDS round(s), 1 in flight, traces off, $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 "$PY" report "$TMP" ${JSON_OUT:+"$JSON_OUT"}
echo
cat "$TMP/intervals.txt"
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
