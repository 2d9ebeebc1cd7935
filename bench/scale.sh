#!/usr/bin/env bash
# Start-up time and memory of large meshes under the local launcher,
# imported: the call graph of N services in Alibaba's format (a tree: the
# entry calls 9, each of those calls up to 10, and so on; each service
# works 1 ms and calls its children side by side, a leaf on 90 % of its
# caller's requests, one leaf in ten twice in a row; 500 requests over
# 10 s), imported as a scenario (`tailmesh import alibaba -o`: one replica
# each, calls with their probability and count, the own times as
# measured) and run as written, open loop at 50/s for 10 s (+1 s warmup)
# with every request traced, for N = 25, 50 and 100, one size after
# another in each round:
#
#   ready s, N services       summary.json's launch_s: from the first
#                             process started to the last one ready
#   RSS GB, N services        the sum of every process's peak resident
#                             memory (hops, the orchestrator), which is at
#                             least what they held together at any moment
#   hop RSS MB, N services    the median hop process's peak
#
# Each round also checks that every request is accounted for and that the
# run wrote its traces (traces.jaeger.json, one trace per sampled request);
# a round that fails either stops the benchmark. The table gives medians
# over the rounds with bootstrap 95 % intervals; the goals, judged on the
# intervals at 100 services: ready in at most 10 s, all processes together
# at most 3 GB.
#
# Usage: bench/scale.sh [-r R] [--sizes 25,50,100] [--strict] [--json FILE]
#   -r R          rounds (default 5)
#   --sizes LIST  the mesh sizes, comma-separated, 2..256 (default 25,50,100)
#   --strict      refuse to run when the 1-minute load average is over 1.5
#                 (default: warn)
#   --json FILE   also write the numbers as JSON
#
# The binary: TAILMESH_BIN, or the release build of this checkout (built
# now). Loopback only; each run stops its own processes, and the temp dir
# is removed on every exit path (Ctrl-C included).
set -euo pipefail

ROUNDS=5
SIZES=25,50,100
STRICT=0
JSON_OUT=""
usage() { sed -n '2,/^set /{ /^#/p; }' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --sizes) SIZES="${2:?--sizes needs a list}"; shift 2 ;;
        --strict) STRICT=1; shift ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "scale: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then
    echo "scale: -r wants a positive integer, got '$ROUNDS'" >&2
    exit 2
fi
IFS=, read -r -a sizes <<<"$SIZES"
for n in "${sizes[@]}"; do
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 2 || n > 256)); then
        echo "scale: --sizes wants sizes from 2 to 256, got '$n'" >&2
        exit 2
    fi
done
if [[ -n $JSON_OUT ]]; then
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PY="$HERE/scale.py"
BENCH=scale
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
steps_traps
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-scale.XXXXXX")"
release_binary
rounds_setup

busy_gate "$STRICT"

for n in "${sizes[@]}"; do
    python3 "$PY" calls "$n" "$TMP/calls-$n.csv"
    step TERM "$BIN" import alibaba "$TMP/calls-$n.csv" -o "$TMP/scale-$n.toml" --name "scale-$n" \
        >"$TMP/import.out" 2>&1 || { cat "$TMP/import.out" >&2; exit 1; }
    printf '\n[telemetry]\nkeep_share = 1.0\n' >>"$TMP/scale-$n.toml"
done
machine_mark
for ((round = 1; round <= ROUNDS; round++)); do
    : >"$TMP/round.tsv"
    for n in "${sizes[@]}"; do
        say "round $round of $ROUNDS: tailmesh run, $n services"
        if ! step INT "$BIN" run "$TMP/scale-$n.toml" --results "$TMP/results" --quiet \
            >"$TMP/run.out" 2>&1; then
            say "tailmesh run failed ($n services):"
            cat "$TMP/run.out" >&2
            exit 1
        fi
        python3 "$PY" round "$TMP/results/scale-$n/latest" "$n" "$TMP/round.tsv" "$TMP/rounds.jsonl"
        rm -rf "$TMP/results"
    done
    round_values "$TMP/round.tsv"
    machine_mark
done

last="${sizes[${#sizes[@]}-1]}"
rounds_report --goal "ready s, $last services<=10" --goal "RSS GB, $last services<=3" \
    >"$TMP/intervals.txt"
echo
echo "scale: imported call graphs of ${SIZES//,/, } services, 50/s for 10 s, every trace kept, $ROUNDS round(s), local launcher, $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 "$PY" report "$TMP/rounds.jsonl" ${JSON_OUT:+"$JSON_OUT"}
echo
cat "$TMP/intervals.txt"
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
