#!/usr/bin/env bash
# One load generator against several at the same total rate: runs
# bench/generators.toml (or SCENARIO) with `[load] generators` 1 and N in
# turn in each round (which goes first alternates), and prints
# - per round, whether each quantile (p50, p90, p99, p99.9) of one run lies
#   inside the other's bootstrap 95 % interval (either way round); one
#   run's interval holds only its own requests' sampling, so two runs of
#   one configuration can miss it too (see -g 1);
# - the same with every round's requests pooled, each interval from
#   resampling the rounds and then each round's requests, so that it also
#   holds what moves from one run to the next: the goal is that every
#   quantile lies inside;
# - the ratios N / 1 of those quantiles, medians over the rounds with
#   bootstrap 95 % intervals (goal: at most 1.05; the interval shows how
#   far below 1 they go);
# - the generators' start skew (their origins' spread on the
#   orchestrator's clock) per round (goal: at most 1 ms);
# - where a difference lies, N minus 1 by round: the p50 of the client's
#   side of the first call (its answered attempt less the first hop's own
#   total) and the p50 of the first hop's total.
#
# Usage: bench/generators.sh [-g N] [-p] [-r ROUNDS] [SCENARIO]
#   -g N       generators of the second run (default 3; 1 compares two runs
#              of one generator: the control, what separates two runs of
#              the same configuration)
#   -p         the one generator in a process of its own, as several run
#              (`tailmesh run --generator-processes`), not inside the
#              orchestrator: several processes against one
#   -r R       rounds (default 16: with fewer, two runs of one
#              configuration, -g 1, can fail the pooled check at p50)
#
# Uses a release build, or the binary TAILMESH_BIN names. Loopback only.
# Leaves nothing behind: every run is stopped by its PID (it stops its own
# hops and generators) and the temp dir removed, on every exit path.
set -euo pipefail

BENCH=generators
ROUNDS=16
GENERATORS=3
ONE_FLAGS=()
positional=()
usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -g|--generators) GENERATORS="${2:?-g needs a number}"; shift 2 ;;
        -p|--processes) ONE_FLAGS=(--generator-processes); shift ;;
        -r|--rounds) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
        *) positional+=("$1"); shift ;;
    esac
done
((${#positional[@]} <= 1)) || { usage >&2; exit 2; }
for v in "$ROUNDS" "$GENERATORS"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -g and -r want positive integers, got '$v'" >&2
        exit 2
    fi
done
SCENARIO="${positional[0]:-}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/steps.sh
source "$HERE/lib/steps.sh"
# shellcheck source=bench/lib/rounds.sh
source "$HERE/lib/rounds.sh"
scenario_setup "$HERE/generators.toml"

release_binary
rounds_setup

# The scenario with `generators = N` in its [load] (any given one replaced).
scenario_with() { # N file
    python3 - "$SCENARIO" "$1" "$2" <<'PY'
import re, sys
src, n, dst = sys.argv[1], sys.argv[2], sys.argv[3]
out, in_load = [], False
for line in open(src):
    if re.match(r"\s*\[", line):
        if in_load:
            out.append(f"generators = {n}\n")
        in_load = re.match(r"\s*\[load\]\s*$", line) is not None
    elif in_load and re.match(r"\s*generators\s*=", line):
        continue
    out.append(line)
if in_load:
    out.append(f"generators = {n}\n")
open(dst, "w").write("".join(out))
PY
}
scenario_with 1 "$TMP/one.toml"
scenario_with "$GENERATORS" "$TMP/many.toml"

measure() { # label round [run flags]; writes $TMP/$label-$round.{json,lat}
    local label=$1 r=$2
    shift 2
    say "round $r: $label"
    if ! step INT "$BIN" run "$TMP/$label.toml" --results "$TMP/results" --quiet --no-traces "$@" \
        >"$TMP/run.out" 2>&1; then
        say "tailmesh run failed:"
        cat "$TMP/run.out" >&2
        exit 1
    fi
    python3 - "$TMP/results" "$TMP/$label-$r" <<'PY'
import csv, json, pathlib, re, sys
run = next(pathlib.Path(sys.argv[1]).glob("*/latest"))
v = json.load(open(run / "summary.json"))["variants"][0]
if v["ok"] != v["sent"]:
    sys.exit(f"generators: {v['sent'] - v['ok']} of {v['sent']} request(s) failed")
lat, client, first = [], [], []
for row in csv.DictReader(open(run / "requests.csv")):
    if row["status"] != "ok":
        continue
    lat.append(float(row["latency_us"]))
    # The client's side: its answered attempt at the first hop, less that
    # hop's own total (the hop record whose parent is empty).
    answered = next(a for a in row["attempts"].split("/") if a.endswith("ok"))
    took = float(re.match(r"[0-9.]+", answered.split("+")[1])[0])
    total = next(float(h.split("/")[0]) for h in row["hops"].split(";") if h.split("/")[2] == "")
    client.append(took - total)
    first.append(total)
open(sys.argv[2] + ".lat", "w").write("\n".join(map(str, lat)) + "\n")
g = v.get("generators") or {}
p50 = lambda xs: sorted(xs)[len(xs) // 2]
json.dump({"ok": v["ok"], "skew_us": g.get("start_skew_us"), "bound_us": g.get("start_skew_bound_us"),
           "client_p50_us": p50(client), "first_hop_p50_us": p50(first)},
          open(sys.argv[2] + ".json", "w"))
PY
    rm -rf "$TMP/results"
}

QUANTILES="0.5 0.9 0.99 0.999"
machine_mark
run_one() { measure one "$r" "${ONE_FLAGS[@]}"; }
run_many() { measure many "$r"; }
for ((r = 1; r <= ROUNDS; r++)); do
    in_turn "$r" run_one run_many
    python3 "$HERE/lib/quantiles.py" round "$TMP/one-$r.lat" "$TMP/many-$r.lat" "$r" $QUANTILES \
        >"$TMP/round.tsv" 2>>"$TMP/inside.txt"
    # Where a difference lies: the client's side of the first call, and
    # the first hop's own total (its downstream calls included).
    python3 - "$TMP/one-$r.json" "$TMP/many-$r.json" >>"$TMP/round.tsv" <<'PY'
import json, sys
one, many = (json.load(open(f)) for f in sys.argv[1:3])
print(f"client p50 many - one, us\t{many['client_p50_us'] - one['client_p50_us']:.1f}")
print(f"first hop p50 many - one, us\t{many['first_hop_p50_us'] - one['first_hop_p50_us']:.1f}")
PY
    round_values "$TMP/round.tsv"
    machine_mark
done

rounds_report --goal "p50 many / one<=1.05" --goal "p90 many / one<=1.05" \
    --goal "p99 many / one<=1.05" --goal "p99.9 many / one<=1.05" >"$TMP/intervals.txt"
echo
echo "$GENERATORS load generators against 1${ONE_FLAGS[*]:+ in a process of its own} at the same total rate: $(basename "$SCENARIO"), $ROUNDS rounds, $(nproc) cores, $(date -u +%Y-%m-%d)"
echo "each quantile (1 generator / $GENERATORS) and whether one lies inside the other's bootstrap 95 % interval:"
sed 's/^/  /' "$TMP/inside.txt"
if ((ROUNDS > 1)); then
    # One round's interval holds only the sampling of its own requests, not
    # what moves from one run to the next (two runs of one configuration
    # differ by more at p50: bench/generators.sh -g 1). Pooled over the
    # rounds, with the rounds resampled as well as each round's requests,
    # the interval holds both.
    echo "all rounds pooled, each interval from resampling the rounds and then each round's requests:"
    python3 "$HERE/lib/quantiles.py" pooled "$TMP" "$ROUNDS" $QUANTILES
fi
python3 - "$TMP" "$ROUNDS" <<'PY'
import json, sys
d, rounds = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{d}/many-{r}.json")) for r in range(1, rounds + 1)]
if any(g["skew_us"] is None for g in runs):
    sys.exit(0)  # -g 1: one generator in process, nothing to start together
print("start skew of the generators per round, measured (at most), us: "
      + ", ".join(f"{g['skew_us']:.1f} ({g['bound_us']:.1f})" for g in runs)
      + f"; largest bound {max(g['bound_us'] for g in runs):.1f} us (goal: at most 1000)")
PY
echo
cat "$TMP/intervals.txt"
exit 0
