# Shared by the bench scripts (sourced, not run): steps run by PID, and the
# clean-up of everything a benchmark starts, on every exit path (Ctrl-C
# included).
#
# The sourcing script sets BENCH (its name, for messages); calls
# steps_traps once, then sets TMP to its temp dir (removed at exit). A
# script with more to stop (a standalone hop) sets STEPS_STOP to the name
# of a function the clean-up calls.

TMP=""
CUR_PID=""     # the foreground step (cargo, h2load, nghttp, tailmesh)
CUR_SIG="TERM"
STEPS_STOP=""

say() { echo "$BENCH: $*" >&2; }

# shellcheck source=bench/lib/wait.sh
source "$(dirname "${BASH_SOURCE[0]}")/wait.sh"

steps_cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    if [[ -n $CUR_PID ]]; then
        # tailmesh run stops its own hops and services on SIGINT (Ctrl-C);
        # the others on TERM.
        kill "-$CUR_SIG" "$CUR_PID" 2>/dev/null
        wait_gone "$CUR_PID" 150 || kill -KILL "$CUR_PID" 2>/dev/null
        wait "$CUR_PID" 2>/dev/null
    fi
    [[ -n $STEPS_STOP ]] && "$STEPS_STOP"
    [[ -n $TMP ]] && rm -rf "$TMP"
    exit "$rc"
}

steps_traps() {
    trap steps_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
}

# The start of a benchmark of one scenario file: SCENARIO (as given, or
# empty) made absolute, or $1 (the default) when empty; python3 and the
# scenario checked; the traps set, TMP made, and the working folder REPO.
# After BENCH, REPO and SCENARIO are set and this file is sourced.
scenario_setup() {
    if [[ -n $SCENARIO ]]; then
        SCENARIO="$(cd "$(dirname "$SCENARIO")" && pwd)/$(basename "$SCENARIO")"
    else
        SCENARIO=$1
    fi
    command -v python3 >/dev/null 2>&1 || { say "python3 not found"; exit 1; }
    [[ -f $SCENARIO ]] || { say "no scenario $SCENARIO"; exit 2; }
    steps_traps
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/tailmesh-$BENCH.XXXXXX")"
    cd "$REPO"
}

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

# Sets BIN, the tailmesh binary the benchmark measures: the one
# TAILMESH_BIN names (another build, for a before/after of two commits,
# run once with each), or the release build of this checkout, built now.
release_binary() {
    if [[ -n ${TAILMESH_BIN:-} ]]; then
        [[ -x $TAILMESH_BIN ]] || { say "TAILMESH_BIN=$TAILMESH_BIN is not an executable"; exit 2; }
        BIN="$(cd "$(dirname "$TAILMESH_BIN")" && pwd)/$(basename "$TAILMESH_BIN")"
        say "measuring $BIN (TAILMESH_BIN)"
        return
    fi
    say "cargo build --release -p tailmesh"
    step TERM cargo build --manifest-path "$REPO/Cargo.toml" --release --quiet -p tailmesh
    BIN="$REPO/target/release/tailmesh"
}

# Prints the load average and the cores; over 1.5 (a busy machine, whose
# numbers are partly its own) warns, or with $1 = 1 (--strict) stops.
busy_gate() {
    local load1
    load1="$(cut -d' ' -f1 /proc/loadavg)"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
    if python3 -c "import sys; sys.exit(float(sys.argv[1]) <= 1.5)" "$load1"; then
        if (($1)); then
            say "load average $load1 is over 1.5 (--strict): the machine is busy; try again when it is quiet"
            exit 1
        fi
        echo "warning: load average $load1 (over 1.5): the machine is busy, the numbers are partly its own"
    fi
}

# Runs `tailmesh run $TMP/scenario.toml --quiet FLAGS...` into
# $TMP/results and writes $TMP/LABEL-ROUND.json: the first variant's ok
# rate (`rps`), p50 and p99 (us); a request not ok fails the benchmark.
# Arguments: LABEL ROUND FLAGS...
measure_run() {
    local label=$1 r=$2
    shift 2
    say "round $r: $label"
    if ! step INT "$BIN" run "$TMP/scenario.toml" --results "$TMP/results" --quiet "$@" \
        >"$TMP/run.out" 2>&1; then
        say "tailmesh run failed:"
        cat "$TMP/run.out" >&2
        exit 1
    fi
    python3 - "$TMP/results" "$TMP/$label-$r.json" "$BENCH" <<'PY'
import json, pathlib, sys
summary = next(pathlib.Path(sys.argv[1]).glob("*/latest/summary.json"))
v = json.load(open(summary))["variants"][0]
if v["ok"] != v["sent"]:
    sys.exit(f"{sys.argv[3]}: {v['sent'] - v['ok']} of {v['sent']} request(s) failed")
lat = v["latency"]
run = {"rps": v["ok_rate"], "p50_us": lat["p50_us"], "p99_us": lat["p99_us"]}
# A traced run's own reading of what tracing cost it.
observer = v.get("observer") or {}
if observer.get("traced"):
    run["observer_us"] = observer.get("cpu_us_per_traced_request")
    run["observer_share"] = observer.get("share_of_cpu")
json.dump(run, open(sys.argv[2], "w"))
PY
    rm -rf "$TMP/results"
}

# The medians over $ROUNDS rounds of measure_run's numbers, a row per
# LABEL (named PREFIX LABEL); with $JSON_OUT, every round's numbers and
# the intervals ($TMP/intervals.json) written there as JSON.
# Arguments: PREFIX LABEL...
measured_medians() {
    local prefix=$1
    shift
    python3 - "$TMP" "$ROUNDS" "${JSON_OUT:-}" "$prefix" "$@" <<'PY'
import json, statistics, sys
d, rounds, out, prefix, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
runs = {t: [json.load(open(f"{d}/{t}-{r}.json")) for r in range(1, rounds + 1)] for t in labels}
width = max(len(prefix + t) for t in labels)
print(f"{'':<{width}} {'per s':>9}  {'p50':>8}  {'p99':>8}")
for t, xs in runs.items():
    med = {k: statistics.median(x[k] for x in xs) for k in ("rps", "p50_us", "p99_us")}
    print(f"{prefix + t:<{width}} {med['rps']:>9.1f}  {med['p50_us']:>6.0f}us  {med['p99_us']:>6.0f}us")
if out:
    doc = {"rounds": rounds, "runs": runs, "intervals": json.load(open(f"{d}/intervals.json"))}
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
PY
}
