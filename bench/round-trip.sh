#!/usr/bin/env bash
# The round trip of `tailmesh import`: bench/round-trip.toml (four hops,
# a fan-out and a chain, sleep work of several milliseconds, one hop slow
# 5 % of the time, every trace kept) is run, its traces imported as a
# scenario (`tailmesh import jaeger ... -o`), and that scenario run with
# every trace kept. Per hop: the Kolmogorov-Smirnov distance between the
# two runs' own times, as the import reads them (work_ns: the time each
# hop drew) and as they took (service_ns: the machine's timer and
# scheduling delays in them); end to end: p50, p90 and p99 of both runs
# and their ratio. Goals (the import's): every distance of the drawn times
# at most 0.05, every end-to-end ratio within 10 %.
#
# Usage: bench/round-trip.sh [-r R] [--json FILE]
#   -r R          rounds: round trips, one after another (default 3)
#   --json FILE   also write the numbers as JSON
#
# The binary: TAILMESH_BIN, or the release build of this checkout (built
# now). Loopback only; the temp dir is removed on every exit path.
set -euo pipefail

ROUNDS=3
JSON_OUT=""
usage() { sed -n '2,/^set /{ /^#/p; }' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "round-trip: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then
    echo "round-trip: -r wants a positive integer, got '$ROUNDS'" >&2
    exit 2
fi
if [[ -n $JSON_OUT ]]; then
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
BENCH=round-trip
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
steps_traps
command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-round-trip.XXXXXX")"
release_binary
busy_gate 0

for ((round = 1; round <= ROUNDS; round++)); do
    dir="$TMP/round-$round"
    mkdir -p "$dir"
    say "round $round of $ROUNDS: the source run"
    step INT "$BIN" run "$HERE/round-trip.toml" --results "$dir/source" --quiet >"$dir/source.out" 2>&1 \
        || { cat "$dir/source.out" >&2; exit 1; }
    step TERM "$BIN" import jaeger "$dir/source/source/latest/traces.jaeger.json" -o "$dir/imported.toml" \
        >"$dir/import.out" 2>&1 || { cat "$dir/import.out" >&2; exit 1; }
    printf '\n[telemetry]\nkeep_share = 1.0\n' >>"$dir/imported.toml"
    say "round $round of $ROUNDS: the imported scenario"
    step INT "$BIN" run "$dir/imported.toml" --results "$dir/rerun" --quiet >"$dir/rerun.out" 2>&1 \
        || { cat "$dir/rerun.out" >&2; exit 1; }
    echo "$(cut -d' ' -f1 /proc/loadavg)" >"$dir/load"
done
echo
echo "round trip: bench/round-trip.toml imported and run again, $ROUNDS round(s), $(nproc) cores, $(date -u +%Y-%m-%d)"
python3 - "$TMP" "$ROUNDS" "${JSON_OUT:-}" <<'PY'
import bisect, glob, json, os, statistics, sys

tmp, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def own_times(run_dir):
    """hop -> (work_ns sorted, service_ns sorted) from a run's Jaeger file."""
    with open(os.path.join(run_dir, "traces.jaeger.json")) as f:
        data = json.load(f)["data"]
    times = {}
    for trace in data:
        for span in trace["spans"]:
            tags = {t["key"]: t["value"] for t in span["tags"]}
            if "work_ns" not in tags:
                continue
            hop = trace["processes"][span["processID"]]["serviceName"].removeprefix("hop-")
            work, took = times.setdefault(hop, ([], []))
            work.append(int(tags["work_ns"]))
            took.append(int(tags["service_ns"]))
    return {h: (sorted(w), sorted(t)) for h, (w, t) in times.items()}

def ks(a, b):
    return max(abs(bisect.bisect_right(a, v) / len(a) - bisect.bisect_right(b, v) / len(b))
               for v in set(a) | set(b))

def run_dir(results):
    return next(d for d in glob.glob(os.path.join(results, "*", "*")) if not d.endswith("latest"))

def latency(d):
    with open(os.path.join(d, "summary.json")) as f:
        v = json.load(f)["variants"][0]
    assert v["accounted"], f"{d}: a request is not accounted for"
    return v["latency"]

rows = []
for r in range(1, rounds + 1):
    base = os.path.join(tmp, f"round-{r}")
    src, rerun = run_dir(os.path.join(base, "source")), run_dir(os.path.join(base, "rerun"))
    a, b = own_times(src), own_times(rerun)
    la, lb = latency(src), latency(rerun)
    rows.append({
        "round": r,
        "load": float(open(os.path.join(base, "load")).read()),
        "ks_drawn": {h: ks(a[h][0], b[h][0]) for h in a},
        "ks_took": {h: ks(a[h][1], b[h][1]) for h in a},
        "end_to_end": {q: (la[q], lb[q]) for q in ("p50_us", "p90_us", "p99_us")},
    })
hops = sorted(rows[0]["ks_drawn"])
print("| hop | KS, drawn (work_ns) | KS, as taken (service_ns) |")
print("|---|---|---|")
for h in hops:
    drawn = " / ".join(f"{r['ks_drawn'][h]:.3f}" for r in rows)
    took = " / ".join(f"{r['ks_took'][h]:.3f}" for r in rows)
    print(f"| {h} | {drawn} | {took} |")
print()
print("| end to end | source | imported | imported / source |")
print("|---|---|---|---|")
for q in ("p50_us", "p90_us", "p99_us"):
    src = " / ".join(f"{r['end_to_end'][q][0] / 1000:.2f}" for r in rows)
    imp = " / ".join(f"{r['end_to_end'][q][1] / 1000:.2f}" for r in rows)
    ratio = " / ".join(f"{r['end_to_end'][q][1] / r['end_to_end'][q][0]:.3f}" for r in rows)
    print(f"| {q[:-3]} | {src} ms | {imp} ms | {ratio} |")
print()
print("one value per round; load average (1 min) after each round: "
      + " / ".join(f"{r['load']:.2f}" for r in rows))
worst_ks = max(max(r["ks_drawn"].values()) for r in rows)
worst_ratio = max(abs(v[1] / v[0] - 1) for r in rows for v in r["end_to_end"].values())
print(f"goals: KS of the drawn times <= 0.05: {'met' if worst_ks <= 0.05 else 'missed'} (worst {worst_ks:.3f}); "
      f"end to end within 10 %: {'met' if worst_ratio <= 0.10 else 'missed'} (worst {worst_ratio:.1%})")
if out:
    with open(out, "w") as f:
        json.dump(rows, f, indent=2)
PY
[[ -n $JSON_OUT ]] && say "wrote $JSON_OUT"
exit 0
