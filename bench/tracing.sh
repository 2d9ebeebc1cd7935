#!/usr/bin/env bash
# The cost of 100 % tracing: runs one scenario with traces off
# (--no-traces) and on (sampling 1.0) in each round, which goes first
# alternating from round to round, and prints the ratios on/off of
# throughput, p50 and p99, read within each round, as medians over the
# rounds with bootstrap 95 % intervals, beside the CPU steal and load
# average during the rounds. The goals, throughput
# on/off at least 0.97, p50 on/off at most 1.03 and p99 on/off at most
# 1.05 (with --imported, throughput on/off at least 0.95), are met when
# the whole interval is on their side, not met when the whole of it is
# past them, undecided otherwise. It also prints what the traced runs
# measured of their own tracing (summary.json's observer: CPU per traced
# request, share of the run's CPU), a steadier reading than the ratios
# where the rounds spread wide.
#
# Usage: bench/tracing.sh [-n REQUESTS] [-r ROUNDS] [--json FILE] [--imported N] [--control] [SCENARIO [ROUNDS]]
#   SCENARIO     the scenario (default bench/tracing.toml)
#   --imported N instead, a mesh of N services imported from a call graph
#                in Alibaba's format (bench/scale.py's tree: fan-out 10,
#                1 ms of own time each, leaves called by 90 % of their
#                callers' requests), driven closed loop, 8 in flight,
#                3000 requests after a 1 s warmup
#   -n N         requests per run (default: the scenario's; -n 2000 for a
#                quick run)
#   -r R         rounds (default 10; a second positional argument too)
#   --json FILE  also write every round's numbers and the intervals as JSON
#   --control    both runs of each round untraced: what the same
#                rounds give when tracing costs nothing, so the width of
#                this machine's intervals is known before a verdict is read
#
# Uses a release build, or the binary TAILMESH_BIN names (another
# commit's, for a before/after). Loopback only (the scenario's hops).
# Leaves nothing behind: every run is stopped by its PID (it stops its own
# hops) and the temp dir removed, on every exit path (Ctrl-C included).
set -euo pipefail

BENCH=tracing
REQUESTS=""
ROUNDS=10
JSON_OUT=""
IMPORTED=""
CONTROL=""
positional=()
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n|--requests) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        --imported) IMPORTED="${2:?--imported needs a service count}"; shift 2 ;;
        --control) CONTROL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
        *) positional+=("$1"); shift ;;
    esac
done
((${#positional[@]} <= 2)) || { usage >&2; exit 2; }
SCENARIO="${positional[0]:-}"
((${#positional[@]} < 2)) || ROUNDS="${positional[1]}"
for v in "$ROUNDS" ${REQUESTS:+"$REQUESTS"} ${IMPORTED:+"$IMPORTED"}; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -n, -r and --imported want positive integers, got '$v'" >&2
        exit 2
    fi
done
# Resolve paths before we cd.
[[ -z $SCENARIO ]] || SCENARIO="$(cd "$(dirname "$SCENARIO")" && pwd)/$(basename "$SCENARIO")"
[[ -z $JSON_OUT ]] || JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
SCENARIO="${SCENARIO:-$HERE/tracing.toml}"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
command -v cargo >/dev/null 2>&1 || { say "cargo not found"; exit 1; }
[[ -z $IMPORTED || -z ${positional[0]:-} ]] || { say "--imported and a SCENARIO exclude each other"; exit 2; }
[[ -n $IMPORTED || -f $SCENARIO ]] || { say "no scenario $SCENARIO"; exit 2; }
steps_traps
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
cd "$REPO"

release_binary
rounds_setup

if [[ -n $IMPORTED ]]; then
    # The imported mesh, its [load] replaced by a closed loop that keeps
    # the machine busy (entries, if the import wrote them, kept).
    python3 "$HERE/scale.py" calls "$IMPORTED" "$TMP/calls.csv"
    "$BIN" import alibaba "$TMP/calls.csv" -o "$TMP/imported.toml" --name "imported-$IMPORTED" \
        >"$TMP/import.out" 2>&1 || { cat "$TMP/import.out" >&2; exit 1; }
    python3 - "$TMP/imported.toml" "${REQUESTS:-3000}" "$TMP/scenario.toml" <<'PY'
import re, sys
src, requests, dst = sys.argv[1], sys.argv[2], sys.argv[3]
out, kept, in_load = [], [], False
for line in open(src):
    if re.match(r"\s*\[", line):
        in_load = re.match(r"\s*\[load\]\s*$", line) is not None
        if in_load:
            continue
    if in_load:
        if re.match(r"\s*entries\s*=", line):
            kept.append(line)
        continue
    out.append(line)
out.append("\n[load]\nmode = \"closed\"\nconcurrency = 8\n"
           f"requests = {requests}\nwarmup = \"1s\"\ntimeout = \"5s\"\n" + "".join(kept))
open(dst, "w").write("".join(out))
PY
    SCENARIO="$TMP/scenario.toml"
elif [[ -n $REQUESTS ]]; then
    # The scenario with `requests = N` and its relative paths made absolute.
    python3 "$HERE/sidecar.py" scenario "$SCENARIO" "$REQUESTS" "$TMP/scenario.toml"
else
    cp "$SCENARIO" "$TMP/scenario.toml"
fi

machine_mark
run_off() { measure_run off "$r" --no-traces; }
run_on() { measure_run on "$r" ${CONTROL:+--no-traces}; }
for ((r = 1; r <= ROUNDS; r++)); do
    in_turn "$r" run_off run_on
    python3 - "$TMP/off-$r.json" "$TMP/on-$r.json" >"$TMP/round.tsv" <<'PY'
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
print(f"throughput on / off\t{on['rps'] / off['rps']!r}")
print(f"p50 on / off\t{on['p50_us'] / off['p50_us']!r}")
print(f"p99 on / off\t{on['p99_us'] / off['p99_us']!r}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done

if [[ -n $IMPORTED ]]; then
    goals=(--goal "throughput on / off>=0.95")
else
    goals=(--goal "throughput on / off>=0.97" --goal "p50 on / off<=1.03" --goal "p99 on / off<=1.05")
fi
rounds_report "${goals[@]}" >"$TMP/intervals.txt"
echo
echo "${CONTROL:+control (both runs untraced) }100 % tracing against none: ${IMPORTED:+an imported mesh of $IMPORTED services, }$(basename "$SCENARIO")${REQUESTS:+, $REQUESTS requests per run}, $ROUNDS rounds (medians), $(nproc) cores, $(date -u +%Y-%m-%d)"
measured_medians "${CONTROL:+untraced in place of }traces " off on
[[ -n $CONTROL ]] || python3 - "$TMP" "$ROUNDS" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{d}/on-{r}.json")) for r in range(1, rounds + 1)]
us = [x["observer_us"] for x in runs if x.get("observer_us") is not None]
share = [100 * x["observer_share"] for x in runs if x.get("observer_share") is not None]
if us and share:
    print(f"tracing's own CPU (summary.json's observer, traced runs): {statistics.median(us):.1f} us per "
          f"traced request ({min(us):.1f} to {max(us):.1f}), {statistics.median(share):.1f} % of the run's "
          f"CPU ({min(share):.1f} to {max(share):.1f})")
PY
echo
cat "$TMP/intervals.txt"
[[ -z $JSON_OUT ]] || say "wrote $JSON_OUT"
exit 0
