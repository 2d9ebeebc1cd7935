#!/usr/bin/env bash
# How well the composed and the declared end-to-end distributions predict
# the measured one. Runs each composition scenario (and hedging.toml) once
# and prints one markdown table, per variant and quantile (p50, p90, p99,
# p99.9): the measured latency with its 95 % interval, the prediction from
# the hops' measured segments composed as independent, the prediction from
# the scenario's declared distributions, and each one's error
# (prediction - measured) / measured. A mark after an error says whether
# the goal is met: composed within 5 % at p50 to p99 and inside the
# measured interval at p99.9; declared within 10 % at p50 to p99.
#
#   bench/compose-accuracy.sh [--duration D] [scenario.toml...]
#       (default: scenarios/compose-*.toml and scenarios/hedging.toml)
#   bench/compose-accuracy.sh --table summary.json...
#       (only print the table of runs already made)
#
# --duration replaces each scenario's [load] duration (e.g. 3s to try the
# script quickly; the tail quantiles then rest on a handful of requests).
# The numbers hold only on a quiet machine: the load average is printed
# before each run, with a warning above 1.5. Uses a release build (or the
# binary TAILMESH_BIN names, built already); results go to a temporary
# folder, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

table() { # $@ = summary.json files, in run order
  python3 - "$@" <<'PY'
import json, sys

QUANTILES = [("p50", "p50_us"), ("p90", "p90_us"), ("p99", "p99_us"), ("p99.9", "p999_us")]
COMPOSED_TOLERANCE = 0.05  # p50 to p99
DECLARED_TOLERANCE = 0.10  # p50 to p99
MET, MISSED = "✓", "✗"


def get(table, key):
    """table[key], or None when the table or the value is missing."""
    return table.get(key) if isinstance(table, dict) else None


def ms(us):
    return "-" if us is None else f"{us / 1000:.2f} ms"


def error(predicted, measured):
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def mark(err, goal):
    """The error in %, with the goal's mark when it has one (goal: True/False/None)."""
    if err is None:
        return "-"
    text = f"{100 * err:+.1f} %"
    return text if goal is None else f"{text} {MET if goal else MISSED}"


rows, notes, goals = [], [], []
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    scenario = get(get(summary, "scenario"), "name") or path
    for variant in get(summary, "variants") or []:
        name = variant.get("name", "?")
        c = get(variant, "composition")
        if c is None:
            notes.append(f"{scenario} / {name}: no composition in summary.json (a binary without it?)")
        measured, composed, declared = get(c, "measured"), get(c, "composed"), get(c, "declared")
        met = {"composed": [0, 0], "declared": [0, 0]}  # quantiles: goal met, judged
        for label, key in QUANTILES:
            m, low, high = get(measured, key), get(get(measured, "low"), key), get(get(measured, "high"), key)
            comp, decl = get(composed, key), get(declared, key)
            comp_err, decl_err = error(comp, m), error(decl, m)
            if key == "p999_us":
                comp_goal = None if None in (comp, low, high) else low <= comp <= high
                decl_goal = None
            else:
                comp_goal = None if comp_err is None else abs(comp_err) <= COMPOSED_TOLERANCE
                decl_goal = None if decl_err is None else abs(decl_err) <= DECLARED_TOLERANCE
            for which, goal in (("composed", comp_goal), ("declared", decl_goal)):
                if goal is not None:
                    met[which][0] += goal
                    met[which][1] += 1
            interval = "" if low is None or high is None else f" [{low / 1000:.2f}, {high / 1000:.2f}]"
            rows.append([scenario, name, label, ms(m) + interval,
                         ms(comp), mark(comp_err, comp_goal), ms(decl), mark(decl_err, decl_goal)])
        goals.append(f"{scenario} / {name}: " + ", ".join(
            f"{which} {ok} of {judged}" for which, (ok, judged) in met.items()))
        if c is not None:
            requests, censored = get(c, "requests"), get(c, "censored")
            if censored:
                notes.append(f"{scenario} / {name}: {censored} of {requests} requests censored (failed or timed out)")
            if get(c, "declared_note"):
                notes.append(f"{scenario} / {name}: declared: {c['declared_note']}")
            check = get(c, "check")
            if get(check, "verdict"):
                reason = get(check, "reason")
                notes.append(f"{scenario} / {name}: distribution check: {check['verdict']}"
                             + (f" ({reason})" if reason else ""))

print("| scenario | variant | q | measured (95 % CI) | composed | err | declared | err |")
print("|---|---|---|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(row) + " |")
print()
print("goals met (quantiles):")
for line in goals:
    print(f"- {line}")
if notes:
    print("notes:")
for note in notes:
    print(f"- {note}")
PY
}

duration=""
scenarios=()
while (($#)); do
  case "$1" in
    --table) shift; (($#)) || { echo "--table needs summary.json files" >&2; exit 2; }; table "$@"; exit ;;
    --duration) duration="${2:?--duration needs a value, e.g. 3s}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compose-accuracy: unknown option: $1" >&2; exit 2 ;;
    *) scenarios+=("$1"); shift ;;
  esac
done
if ((${#scenarios[@]} == 0)); then
  scenarios=(scenarios/compose-*.toml scenarios/hedging.toml)
fi

bin="${TAILMESH_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --locked --quiet -p tailmesh
  bin=target/release/tailmesh
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "machine: $(nproc) cores, ${model:-unknown CPU model}"

summaries=()
for scenario in "${scenarios[@]}"; do
  label="$(basename "$scenario" .toml)"
  if [ -n "$duration" ]; then
    python3 bench/lib/set-duration.py "$scenario" "$duration" "$out/$label.toml"
    scenario="$out/$label.toml"
  fi
  uptime
  load1="$(cut -d' ' -f1 /proc/loadavg)"
  if python3 -c "import sys; sys.exit(float(sys.argv[1]) <= 1.5)" "$load1"; then
    echo "warning: load average $load1 (over 1.5): the machine is busy, the tails are partly its own"
  fi
  if ! "$bin" run "$scenario" --results "$out/$label" --quiet >"$out/$label.log" 2>&1; then
    echo "compose-accuracy: $scenario failed; the end of its output:" >&2
    tail -n 20 "$out/$label.log" >&2
    exit 1
  fi
  # <results>/<scenario>/<run-id>/summary.json; `latest` is a link, not followed.
  run="$(find "$out/$label" -mindepth 3 -maxdepth 3 -name summary.json | sort | tail -n 1)"
  [ -n "$run" ] || { echo "compose-accuracy: $scenario wrote no summary.json" >&2; exit 1; }
  echo "$label done"
  summaries+=("$run")
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
table "${summaries[@]}"
