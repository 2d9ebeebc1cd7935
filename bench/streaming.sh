#!/usr/bin/env bash
# Streams against unary calls: a 3-hop push chain with no work of its own
# (bench/streaming.toml), driven closed loop with one request in flight,
# once as unary calls and once as the messages of one bidirectional
# stream (`streaming = "bidi"` on every hop, `[load.streams]`), both in
# each round (which goes first alternates); prints the ratios
# stream/unary of throughput (messages or requests answered per second)
# and p50, read within each round, as medians over the rounds with
# bootstrap 95 % intervals. The goals,
# throughput stream/unary at least 1.5 and p50 stream/unary at most 1, are
# met when the whole interval is on their side. Then one run of 1,000
# streams at once (open loop, 2,000 messages a second, 20 a stream), which
# must account for every message and end every stream.
#
# Usage: bench/streaming.sh [-n REQUESTS] [-r ROUNDS] [--json FILE]
#   -n N         requests (messages) per run (default 20000)
#   -r R         rounds (default 10)
#   --json FILE  also write every round's numbers and the intervals as JSON
#
# Traces are off in every run: this measures the transport. Uses a
# release build, or the binary TAILMESH_BIN names. Loopback only. Leaves
# nothing behind: every run is stopped by its PID (it stops its own hops)
# and the temp dir removed, on every exit path (Ctrl-C included).
set -euo pipefail

BENCH=streaming
REQUESTS=20000
ROUNDS=10
JSON_OUT=""
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$ROUNDS" "$REQUESTS"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -n and -r want positive integers, got '$v'" >&2
        exit 2
    fi
done
[[ -z $JSON_OUT ]] || JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
command -v cargo >/dev/null 2>&1 || { say "cargo not found"; exit 1; }
steps_traps
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
cd "$REPO"

release_binary
rounds_setup

# The unary chain, the same chain by stream, and the 1,000 streams.
python3 - "$HERE/streaming.toml" "$REQUESTS" "$TMP" <<'PY'
import re, sys
src, requests, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
text = re.sub(r"(?m)^requests = \d+$", f"requests = {requests}", open(src).read())
open(f"{tmp}/unary.toml", "w").write(text)
streamed = re.sub(r'(?m)^(name = "[abc]")$', r'\1\nstreaming = "bidi"', text)
# One stream carries every message of the run.
streamed = streamed.replace("[[hop]]", f"[load.streams]\nmessages = {requests}\n\n[[hop]]", 1)
open(f"{tmp}/stream.toml", "w").write(streamed)
many = re.sub(r'(?ms)^\[load\].*?(?=^\[)', "[load]\nmode = \"open\"\nrate = 2000\nduration = \"10s\"\n"
              "warmup = \"1s\"\ntimeout = \"2s\"\n\n[load.streams]\nstreams = 1000\nmessages = 20\n\n",
              streamed.replace(f"[load.streams]\nmessages = {requests}\n\n", ""))
open(f"{tmp}/many.toml", "w").write(many)
PY

machine_mark
run_unary() {
    cp "$TMP/unary.toml" "$TMP/scenario.toml"
    measure_run unary "$r" --no-traces
}
run_stream() {
    cp "$TMP/stream.toml" "$TMP/scenario.toml"
    measure_run stream "$r" --no-traces
}
for ((r = 1; r <= ROUNDS; r++)); do
    in_turn "$r" run_unary run_stream
    python3 - "$TMP/unary-$r.json" "$TMP/stream-$r.json" >"$TMP/round.tsv" <<'PY'
import json, sys
unary, stream = (json.load(open(p)) for p in sys.argv[1:3])
print(f"throughput stream / unary\t{stream['rps'] / unary['rps']!r}")
print(f"p50 stream / unary\t{stream['p50_us'] / unary['p50_us']!r}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done
rounds_report --goal "throughput stream / unary>=1.5" --goal "p50 stream / unary<=1" >"$TMP/intervals.txt"

# 1,000 streams at once: every message answered, every stream held.
cp "$TMP/many.toml" "$TMP/scenario.toml"
say "1000 streams"
if ! step INT "$BIN" run "$TMP/scenario.toml" --results "$TMP/results" --quiet --no-traces \
    >"$TMP/run.out" 2>&1; then
    say "tailmesh run failed:"
    cat "$TMP/run.out" >&2
    exit 1
fi
many_ok=0
python3 - "$TMP/results" >"$TMP/many.txt" <<'PY' || many_ok=1
import json, pathlib, sys
v = json.load(open(next(pathlib.Path(sys.argv[1]).glob("*/latest/summary.json"))))["variants"][0]
s = v["streams"]
errors = sum(v["errors"].values())
held = s["completed"] == s["opened"] and not s["aborted"]
accounted = v["accounted"] and v["sent"] == v["ok"] + errors + v["timeouts"]
print(f"1000 streams at once: {v['sent']} messages sent, {v['ok']} answered, {errors} errors, "
      f"{v['timeouts']} timeouts ({'every one accounted for' if accounted else 'NOT ACCOUNTED'}); "
      f"{s['opened']} streams opened, {s['completed']} held to their end, "
      f"{sum(s['aborted'].values())} broke, {s['refused_by_cap']} refused by the cap; "
      f"p50 {v['latency']['p50_us']} us, p99 {v['latency']['p99_us']} us")
sys.exit(0 if accounted and held else 1)
PY
rm -rf "$TMP/results"

echo
echo "One stream against unary calls, 1 in flight: streaming.toml, $REQUESTS requests per run, $ROUNDS rounds (medians), $(nproc) cores, $(date -u +%Y-%m-%d)"
measured_medians "" unary stream
echo
cat "$TMP/intervals.txt"
cat "$TMP/many.txt"
[[ -z $JSON_OUT ]] || say "wrote $JSON_OUT"
exit "$many_ok"
