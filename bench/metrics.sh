#!/usr/bin/env bash
# The cost of live metrics: runs bench/tracing.toml (a closed-loop 3-hop
# chain with no work, traces off) without and with `--metrics`, scraped
# every second in the protobuf format with native histograms as Prometheus
# asks for it, both in each round (which goes first alternates), and
# prints the ratio on/off of throughput read within each round, as a
# median over the rounds with its bootstrap 95 % interval. The goal,
# throughput on/off at least 0.99, is met when the whole interval is at
# or above it.
#
# Usage: bench/metrics.sh [-r ROUNDS] [-n REQUESTS]
#   -r R   rounds (default 10)
#   -n N   requests per run (default the scenario's 20000)
#
# Uses a release build, or the binary TAILMESH_BIN names. Loopback only.
# Leaves nothing behind: every run and the scraper are stopped by their
# PIDs and the temp dir removed, on every exit path.
set -euo pipefail

BENCH=metrics
ROUNDS=10
REQUESTS=""
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$ROUNDS" ${REQUESTS:+"$REQUESTS"}; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "$BENCH: -r and -n want positive integers, got '$v'" >&2; exit 2; }
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
command -v curl >/dev/null 2>&1 || { say "curl not found"; exit 1; }
SCRAPER=""
stop_scraper() { [[ -z $SCRAPER ]] || { kill "$SCRAPER" 2>/dev/null || true; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=""; }; }
steps_traps
STEPS_STOP=stop_scraper
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
cd "$REPO"
release_binary
rounds_setup
busy_gate 0
if [[ -n $REQUESTS ]]; then
    python3 "$HERE/sidecar.py" scenario "$HERE/tracing.toml" "$REQUESTS" "$TMP/scenario.toml"
else
    cp "$HERE/tracing.toml" "$TMP/scenario.toml"
fi
printf '\n[telemetry]\nmetrics_grace = "0s"\n' >>"$TMP/scenario.toml"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

ACCEPT='application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited'
machine_mark
run_off() { measure_run off "$r" --no-traces; }
run_on() {
    local port
    port="$(free_port)"
    # A scrape a second, as Prometheus would, for as long as the run lasts.
    (while sleep 1; do curl -s -o /dev/null -H "Accept: $ACCEPT" "http://127.0.0.1:$port/metrics" || true; done) &
    SCRAPER=$!
    measure_run on "$r" --no-traces --metrics "127.0.0.1:$port"
    stop_scraper
}
for ((r = 1; r <= ROUNDS; r++)); do
    in_turn "$r" run_off run_on
    python3 - "$TMP/off-$r.json" "$TMP/on-$r.json" >"$TMP/round.tsv" <<'PY'
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
print(f"throughput on / off\t{on['rps'] / off['rps']!r}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done
rounds_report --goal "throughput on / off>=0.99" >"$TMP/intervals.txt"
echo
echo "live metrics, scraped each second, against none: tracing.toml${REQUESTS:+, $REQUESTS requests per run}, $ROUNDS rounds, $(nproc) cores, $(date -u +%Y-%m-%d)"
cat "$TMP/intervals.txt"
