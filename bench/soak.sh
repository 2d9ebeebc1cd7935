#!/usr/bin/env bash
# The soak benchmark: bench/soak.toml (open loop at 3,000/s for 10 minutes
# through a 3-hop zero-work push chain with injected slowness, errors and
# retries, every request traced, about 1.8 million requests), with the
# memory of the orchestrator and of each hop process sampled from /proc
# while it runs, the disk the run folder takes (its peak too), the size of
# the Jaeger file(s), whether every request is accounted for, and whether
# every slow, failed and retried request's trace is in the Jaeger files,
# whole and in the format Jaeger's UI loads (bench/jaeger_check.py).
#
# Usage: bench/soak.sh [--duration D] [--rate R] [--interval S] [--early D]
#                      [--out DIR] [--json FILE] [--no-build]
#   --duration D  the measured phase, e.g. 20s, 10m (default: bench/soak.toml's,
#                 10m; env SOAK_DURATION)
#   --rate R      requests per second (default: bench/soak.toml's, 3000;
#                 env SOAK_RATE); a smoke run: --duration 20s --rate 500
#   --interval S  seconds between memory samples (default 1; env SOAK_INTERVAL)
#   --early D     the early memory mark, after the orchestrator started
#                 (default 60s: "at 1 minute"; a smoke run can lower it)
#   --out DIR     where everything goes (default results/soak-bench/<UTC time>)
#   --json FILE   also write the results as JSON there
#   --no-build    use the release binary as it is (default: cargo build
#                 --release -p tailmesh first, a no-op when it is fresh)
#
# The binary is ${CARGO_TARGET_DIR:-target}/release/tailmesh. In --out: the
# scenario as run (scenario.toml), tailmesh's output (tailmesh.log), the run
# folder (run/soak/<run-id>/), memory over time (rss.csv: t_s, process, pid,
# vmrss_kb, vmhwm_kb; t_s = seconds since the orchestrator started), the run
# folder's size over time (disk.csv), and the results (soak.md, soak.json).
# Prints a Markdown table and one JSON line. Exits 1 when the run failed or
# a request is not accounted for, 130 when interrupted; memory and file-size
# goals only print as met / missed. Linux only (/proc). Loopback only.
set -euo pipefail

BENCH=soak
say() { echo "$BENCH: $*" >&2; }
usage() { sed -n '2,/^set /{ /^#/p; }' "$0" | sed 's/^# \{0,1\}//'; }

DURATION="${SOAK_DURATION:-}"
RATE="${SOAK_RATE:-}"
INTERVAL="${SOAK_INTERVAL:-1}"
EARLY=60s
OUT=""
JSON_OUT=""
BUILD=1
while (($#)); do
    case "$1" in
        --duration) DURATION="${2:?--duration needs a duration}"; shift 2 ;;
        --rate) RATE="${2:?--rate needs a number}"; shift 2 ;;
        --interval) INTERVAL="${2:?--interval needs seconds}"; shift 2 ;;
        --early) EARLY="${2:?--early needs a duration}"; shift 2 ;;
        --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
        --json) JSON_OUT="${2:?--json needs a file}"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) say "unknown argument: $1"; usage >&2; exit 2 ;;
    esac
done

# Whole seconds from "90", "90s", "10m" or "1h"; fails on anything else.
seconds() {
    [[ $1 =~ ^([0-9]+)(s|m|h)?$ ]] || return 1
    local n=$((10#${BASH_REMATCH[1]}))
    case "${BASH_REMATCH[2]:-s}" in
        s) echo "$n" ;;
        m) echo $((n * 60)) ;;
        h) echo $((n * 3600)) ;;
    esac
}
DURATION_S=""
if [[ -n $DURATION ]]; then
    DURATION_S="$(seconds "$DURATION")" && ((DURATION_S > 0)) || {
        say "--duration wants whole seconds, minutes or hours (20s, 10m, 1h), got '$DURATION'"
        exit 2
    }
fi
EARLY_S="$(seconds "$EARLY")" && ((EARLY_S > 0)) || {
    say "--early wants whole seconds, minutes or hours (60s, 1m), got '$EARLY'"
    exit 2
}
if [[ -n $RATE ]] && ! [[ $RATE =~ ^[1-9][0-9]*$ ]]; then
    say "--rate wants a positive whole number of requests per second, got '$RATE'"
    exit 2
fi
if ! [[ $INTERVAL =~ ^([1-9][0-9]*|[0-9]*\.[0-9]*[1-9][0-9]*)$ ]]; then
    say "--interval wants a positive number of seconds, got '$INTERVAL'"
    exit 2
fi
[[ -r /proc/self/status ]] || { say "needs Linux's /proc"; exit 1; }
for tool in python3 setsid cargo; do
    if [[ $tool == cargo ]] && ((!BUILD)); then continue; fi
    command -v "$tool" >/dev/null 2>&1 || { say "$tool not found"; exit 1; }
done
if [[ -n $JSON_OUT ]]; then
    # Resolve before we cd.
    JSON_OUT="$(cd "$(dirname "$JSON_OUT")" && pwd)/$(basename "$JSON_OUT")"
fi
if [[ -n $OUT ]]; then
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
TARGET="${CARGO_TARGET_DIR:-target}"
[[ $TARGET == /* ]] || TARGET="$REPO/$TARGET"
BIN="$TARGET/release/tailmesh"
if [[ -z $OUT ]]; then
    OUT="$REPO/results/soak-bench/$(date -u +%Y%m%dT%H%M%SZ)"
fi
mkdir -p "$OUT"
if [[ -e $OUT/rss.csv || -e $OUT/run ]]; then
    say "$OUT already holds a soak run; give another --out"
    exit 2
fi

RUN_PID=""
SAMPLER_PID=""
INTERRUPTED=0

# shellcheck source=bench/lib/wait.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/wait.sh"

# On any exit: the run, if still going, is stopped as Ctrl-C stops it (it
# writes what it measured), then killed if it does not end; then the
# sampler. The results folder stays.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    if [[ -n $RUN_PID ]] && kill -0 "$RUN_PID" 2>/dev/null; then
        kill -INT "$RUN_PID" 2>/dev/null
        wait_gone "$RUN_PID" 600 || kill -KILL "$RUN_PID" 2>/dev/null
        wait "$RUN_PID" 2>/dev/null
    fi
    if [[ -n $SAMPLER_PID ]] && kill -0 "$SAMPLER_PID" 2>/dev/null; then
        kill -TERM "$SAMPLER_PID" 2>/dev/null
        wait "$SAMPLER_PID" 2>/dev/null
    fi
    exit "$rc"
}
trap cleanup EXIT
# Each Ctrl-C (or TERM, HUP) is passed on to the run as a Ctrl-C: the first
# stops sending and writes the results, a second gives up the requests in
# flight (see docs/commands.md); the report still follows.
interrupt() {
    INTERRUPTED=1
    if [[ -n $RUN_PID ]] && kill -0 "$RUN_PID" 2>/dev/null; then
        say "interrupted: stopping the run (it writes what it measured)"
        kill -INT "$RUN_PID" 2>/dev/null || true
    else
        exit 130
    fi
}
trap interrupt INT TERM HUP

if ((BUILD)); then
    say "cargo build --release -p tailmesh"
    cargo build --release --quiet -p tailmesh
fi
[[ -x $BIN ]] || { say "no release binary at $BIN (build it: cargo build --release -p tailmesh)"; exit 1; }

# The scenario as run: bench/soak.toml with --rate and --duration put in.
python3 - bench/soak.toml "$OUT/scenario.toml" "$RATE" "$DURATION_S" <<'PY'
import re, sys

src, dst, rate, dur = sys.argv[1:]
wanted = {"rate": rate, "duration": f'"{dur}s"' if dur else ""}
out, section, done = [], None, set()
for line in open(src):
    m = re.match(r"\s*\[\[?([^\[\]]+)\]\]?\s*(#.*)?$", line)  # [table] or [[array]]
    if m:
        section = m.group(1).strip()
    elif section == "load":
        for key, value in wanted.items():
            if value and re.match(rf"\s*{key}\s*=", line):
                line = f"{key} = {value}\n"
                done.add(key)
    out.append(line)
missing = sorted(k for k, v in wanted.items() if v and k not in done)
if missing:
    sys.exit(f"soak: no {' or '.join(missing)} line in [load] of {src}")
open(dst, "w").writelines(out)
PY
"$BIN" validate "$OUT/scenario.toml" >"$OUT/validate.log" 2>&1 || {
    say "the scenario does not validate:"
    cat "$OUT/validate.log" >&2
    exit 1
}

# The machine's load before the run, printed beside the one after.
cp /proc/loadavg "$OUT/loadavg-start"
mkdir -p "$OUT/run"
say "tailmesh run $OUT/scenario.toml --results $OUT/run (rate ${RATE:-as in bench/soak.toml}, duration ${DURATION:-as in bench/soak.toml})"
# In its own session (setsid execs in place: $! is tailmesh), so that a
# Ctrl-C at the terminal reaches only this script, whose trap passes it on
# once; the hops follow the orchestrator as in any run.
setsid "$BIN" run "$OUT/scenario.toml" --results "$OUT/run" --quiet >"$OUT/tailmesh.log" 2>&1 &
RUN_PID=$!

# The sampler: every INTERVAL seconds, VmRSS and VmHWM of the orchestrator
# and of every process below it (found by parent pid: the hops, a broker),
# and the run folder's size, until the orchestrator is gone. Each row is
# flushed, so the CSVs grow while the run does.
python3 - "$RUN_PID" "$INTERVAL" "$OUT" <<'PY' &
import csv, os, signal, sys, time

signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run ends itself on Ctrl-C; we follow it
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pid, interval, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
run_root = os.path.join(out, "run")
tick = os.sysconf("SC_CLK_TCK")


def stat(p):
    """(state, ppid, start time in ticks since boot) of a process."""
    with open(f"/proc/{p}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def memory(p):
    kb = {}
    with open(f"/proc/{p}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                kb[line[:5]] = int(line.split()[1])
    return kb.get("VmRSS"), kb.get("VmHWM")


def name_of(p):
    """A hop is named by its config file (hop-<hop>-<replica>.json)."""
    with open(f"/proc/{p}/cmdline", "rb") as f:
        args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    if "--config" in args[:-1]:
        return os.path.splitext(os.path.basename(args[args.index("--config") + 1]))[0]
    if "broker" in args[1:2]:
        return "broker"
    with open(f"/proc/{p}/comm") as f:
        return f"{f.read().strip()}-{p}"


def disk(root):
    """Bytes allocated (as du counts them) and apparent bytes under root."""
    used = size = 0
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            try:
                st = os.lstat(os.path.join(d, n))
            except OSError:
                continue  # renamed into place or removed meanwhile
            used += st.st_blocks * 512
            size += st.st_size
    return used, size


# bash forks, then execs tailmesh: wait for the exec.
deadline = time.monotonic() + 10
while True:
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "tailmesh":
                break
    except OSError:
        sys.exit(0)  # gone already: the report says the run failed
    if time.monotonic() > deadline:
        sys.exit(f"soak: pid {pid} did not become tailmesh")
    time.sleep(0.01)
_, _, started = stat(pid)
boot_s = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)


def orchestrator():
    """(seconds since it started, VmRSS, VmHWM), or None once it is gone."""
    try:
        state, _, start = stat(pid)
        if state == "Z" or start != started:
            return None
        t = round(boot_s() - started / tick, 2)
        rss_kb, hwm_kb = memory(pid)
    except OSError:
        return None
    # A process that turned zombie between the two reads has no VmRSS.
    return None if rss_kb is None else (t, rss_kb, hwm_kb)


names = {}
with open(os.path.join(out, "rss.csv"), "w", newline="") as rf, \
        open(os.path.join(out, "disk.csv"), "w", newline="") as df:
    rss, dsk = csv.writer(rf), csv.writer(df)
    rss.writerow(["t_s", "process", "pid", "vmrss_kb", "vmhwm_kb"])
    dsk.writerow(["t_s", "run_dir_du_bytes", "run_dir_apparent_bytes"])
    next_at = time.monotonic()
    last = orchestrator()
    while last is not None:
        t = last[0]
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    _, ppid, st = stat(int(entry))
                except OSError:
                    continue
                children.setdefault(ppid, []).append((int(entry), st))
        rows = [(t, "orchestrator", pid, *last[1:])]
        todo = list(children.get(pid, []))
        while todo:
            p, st = todo.pop()
            todo.extend(children.get(p, []))
            try:
                if (p, st) not in names:
                    names[(p, st)] = name_of(p)
                rows.append((t, names[(p, st)], p, *memory(p)))
            except (OSError, IndexError):
                continue  # exited meanwhile
        rss.writerows(("" if v is None else v for v in r) for r in rows)
        rf.flush()
        dsk.writerow([t, *disk(run_root)])
        df.flush()
        # Between rows the orchestrator alone is read every 50 ms, so the
        # last row (below) has its peak to within 50 ms of its exit: it
        # writes the Jaeger file, its largest allocation, in its last
        # moments.
        next_at = max(next_at + interval, time.monotonic())
        while last is not None and time.monotonic() < next_at:
            time.sleep(min(0.05, max(0.0, next_at - time.monotonic())))
            now = orchestrator()
            if now is None and last[0] != t:
                rss.writerow(("" if v is None else v for v in (last[0], "orchestrator", pid, *last[1:])))
            last = now
        if last is not None:
            last = orchestrator()
PY
SAMPLER_PID=$!

# `wait` returns early when a trapped signal arrives; wait again until the
# run has really ended, for its exit status.
RUN_RC=0
while :; do
    wait "$RUN_PID" && RUN_RC=0 || RUN_RC=$?
    kill -0 "$RUN_PID" 2>/dev/null || break
done
RUN_PID=""
wait "$SAMPLER_PID" || say "the memory sampler failed (status $?)"
SAMPLER_PID=""
if ((RUN_RC != 0 && !INTERRUPTED)); then
    say "tailmesh run exited $RUN_RC; the end of its output ($OUT/tailmesh.log):"
    tail -n 20 "$OUT/tailmesh.log" >&2
fi

REPORT_RC=0
SOAK_BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" \
python3 - "$OUT" "$RUN_RC" "$INTERRUPTED" "$EARLY_S" "$INTERVAL" "$JSON_OUT" <<'PY' || REPORT_RC=$?
import csv, glob, json, os, sys, tomllib

out, run_rc, interrupted, early_s, interval, json_out = sys.argv[1:]
run_rc, interrupted, early_s, interval = int(run_rc), interrupted == "1", int(early_s), float(interval)
MB = 1024 * 1024
PEAK_GOAL_MB, DRIFT_GOAL, JAEGER_GOAL_MB = 300, 0.20, 50

with open(os.path.join(out, "scenario.toml"), "rb") as f:
    load = tomllib.load(f)["load"]


def loadavg(path):
    try:
        return float(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def num(s):
    return int(s) if s not in ("", None) else None


# The run folder's largest size while the run lasted (the span spool
# included), bytes as du counts them.
peak_disk = None
try:
    with open(os.path.join(out, "disk.csv"), newline="") as f:
        peak_disk = max((int(r["run_dir_du_bytes"]) for r in csv.DictReader(f)), default=None)
except (OSError, ValueError):
    pass

# Memory over time, per process name.
series = {}
try:
    with open(os.path.join(out, "rss.csv"), newline="") as f:
        for r in csv.DictReader(f):
            series.setdefault(r["process"], []).append(
                (float(r["t_s"]), num(r["vmrss_kb"]), num(r["vmhwm_kb"])))
except OSError:
    pass
hops = sorted(n for n in series if n != "orchestrator")
# The load runs while the hops do: its end is the last sample with a hop alive.
load_end_t = max((t for n in hops for t, _, _ in series[n]), default=None)


def at(name, t_min, t_max=None):
    """VmRSS of the first sample at or after t_min (not after t_max), kB."""
    for t, rss, _ in series.get(name, []):
        if t >= t_min and (t_max is None or t <= t_max) and rss is not None:
            return rss
    return None


def last(name, t_max=None):
    found = None
    for t, rss, _ in series.get(name, []):
        if (t_max is None or t <= t_max) and rss is not None:
            found = rss
    return found


def peak(name):
    values = [v for _, rss, hwm in series.get(name, []) for v in (rss, hwm) if v is not None]
    return max(values, default=None)


def process_row(name):
    in_mb = lambda kb: None if kb is None else kb / 1024
    return {
        "process": name,
        "samples": len(series.get(name, [])),
        "rss_at_early_mb": in_mb(at(name, early_s, load_end_t)) if load_end_t is not None else None,
        "rss_at_load_end_mb": in_mb(last(name, load_end_t)),
        "rss_final_mb": in_mb(last(name)),
        "peak_mb": in_mb(peak(name)),
    }


orch = process_row("orchestrator")
drift = None
if orch["rss_at_early_mb"] and orch["rss_at_load_end_mb"] is not None:
    drift = orch["rss_at_load_end_mb"] / orch["rss_at_early_mb"] - 1

# The run folder.
runs = [p for p in glob.glob(os.path.join(out, "run", "*", "*"))
        if os.path.basename(p) != "latest" and os.path.isdir(p)]
run_dir = max(runs, default=None)
summary = None
if run_dir:
    try:
        summary = json.load(open(os.path.join(run_dir, "summary.json")))
    except (OSError, ValueError):
        pass
used = size = 0
files = []
if run_dir:
    for d, dirs, names in os.walk(run_dir):
        for n in dirs + names:
            st = os.lstat(os.path.join(d, n))
            used += st.st_blocks * 512
            size += st.st_size
            if n in names:
                files.append((os.path.relpath(os.path.join(d, n), run_dir), st.st_size))
# traces.jaeger.json, and traces-2.jaeger.json ... where a binary splits them.
jaeger = sorted((f for f in files if ".jaeger.json" in os.path.basename(f[0])), key=lambda f: -f[1])

# Every request accounted for: summary.json's own verdict and sent = ok +
# errors + timeouts recomputed, per variant.
variants = []
for v in (summary or {}).get("variants", []):
    errors = sum(v.get("errors", {}).values())
    variants.append({
        "name": v["name"],
        "sent": v["sent"], "ok": v["ok"], "errors": errors, "timeouts": v["timeouts"],
        "accounted": v["accounted"],
        "sum_matches": v["sent"] == v["ok"] + errors + v["timeouts"],
        "warmup": v.get("warmup"),
        "achieved_rate": v.get("achieved_rate"),
        "latency_us": {k: v["latency"].get(k) for k in ("p50_us", "p99_us", "p99_9_us", "p99_99_us", "max_us")},
    })
accounted = bool(summary) and bool(variants) and all(v["accounted"] and v["sum_matches"] for v in variants) \
    and summary.get("check", {}).get("accounted", True)


def counts(node, path=""):
    """Numeric leaves under node whose path names spans, kept or dropped
    traces, or tail sampling (a binary with tail sampling reports
    traces.sampling per variant; older ones only spans and dropped)."""
    found = {}
    if isinstance(node, dict):
        for k, v in node.items():
            found.update(counts(v, f"{path}.{k}" if path else k))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        if any(w in path for w in ("spans", "kept", "dropped", "sampl")):
            found[path] = node
    return found


trace_counts = counts((summary or {}).get("traces"), "traces")
for v in (summary or {}).get("variants", []):
    trace_counts.update(counts(v.get("traces"), f"variants.{v['name']}.traces"))

# The tail's traces: every slow, failed or retried request's trace in the
# Jaeger files, whole, and the files in the format Jaeger's UI loads.
sys.path.insert(0, os.environ["SOAK_BENCH_DIR"])
import jaeger_check  # noqa: E402
tail = None
if run_dir and summary is not None:
    try:
        tail = jaeger_check.check(run_dir)
    except (OSError, ValueError, KeyError) as e:
        tail = {"ok": False, "error": str(e)}
hops_drift = {}
for n in hops:
    row = process_row(n)
    if row["rss_at_early_mb"] and row["rss_at_load_end_mb"] is not None:
        hops_drift[n] = row["rss_at_load_end_mb"] / row["rss_at_early_mb"] - 1

failed = run_rc != 0 or summary is None
goals = {
    "tail_traces_whole_and_jaeger_format": None if tail is None else tail["ok"],
    "hops_early_and_end_within_20_percent": None if not hops_drift else all(abs(d) <= DRIFT_GOAL for d in hops_drift.values()),
    "orchestrator_peak_under_300_mb": None if orch["peak_mb"] is None else orch["peak_mb"] < PEAK_GOAL_MB,
    "orchestrator_early_and_end_within_20_percent": None if drift is None else abs(drift) <= DRIFT_GOAL,
    "each_jaeger_file_at_most_50_mb": None if not jaeger else jaeger[0][1] <= JAEGER_GOAL_MB * MB,
}
doc = {
    "bench": "soak",
    "rate": load.get("rate"), "duration": load.get("duration"), "sample_interval_s": interval,
    "early_mark_s": early_s, "load_end_s": load_end_t,
    "run_exit_status": run_rc, "interrupted": interrupted, "run_dir": run_dir,
    "failed": failed, "accounted": accounted, "variants": variants,
    "orchestrator": orch, "orchestrator_drift": drift,
    "hops": [process_row(n) for n in hops],
    "run_dir_du_bytes": used, "run_dir_apparent_bytes": size,
    "largest_files": [{"path": p, "bytes": b} for p, b in sorted(files, key=lambda f: -f[1])[:5]],
    "jaeger_files": [{"path": p, "bytes": b} for p, b in jaeger],
    "trace_counts": trace_counts,
    "tail_traces": tail,
    "hops_drift": hops_drift,
    "run_dir_peak_bytes": peak_disk,
    "goals": goals,
    "load_average": {"before": loadavg(os.path.join(out, "loadavg-start")), "after": loadavg("/proc/loadavg")},
    "cores": os.cpu_count(),
}

mb = lambda x: "-" if x is None else f"{x:,.1f} MB"
fmt = lambda x, unit, spec="": "-" if x is None else f"{x:,{spec}}{unit}"
verdict = lambda ok: "n/a" if ok is None else ("met" if ok else "**missed**")
early_label = f"{early_s} s" if early_s % 60 else f"{early_s // 60} min"
rows = []
for v in variants:
    rows.append((f"requests ({v['name']})",
                 f"sent {v['sent']:,} = ok {v['ok']:,} + errors {v['errors']:,} + timeouts {v['timeouts']:,}"
                 f"; {fmt(v['achieved_rate'], '/s', '.0f')}; p99 {fmt(v['latency_us']['p99_us'], ' us')}, "
                 f"p99.99 {fmt(v['latency_us']['p99_99_us'], ' us')}",
                 "accounted" if v["accounted"] and v["sum_matches"] else "**not accounted**"))
if not variants:
    rows.append(("requests", "no summary.json" if summary is None else "no variants", "**not accounted**"))
rows.append((f"orchestrator RSS at {early_label} / end of load",
             f"{mb(orch['rss_at_early_mb'])} / {mb(orch['rss_at_load_end_mb'])}"
             + ("" if drift is None else f" ({drift * 100:+.1f} %)"),
             f"within 20 %: {verdict(goals['orchestrator_early_and_end_within_20_percent'])}"
             + ("" if drift is not None else f" (run shorter than {early_label})")))
rows.append(("orchestrator RSS peak / final", f"{mb(orch['peak_mb'])} / {mb(orch['rss_final_mb'])}",
             f"peak under {PEAK_GOAL_MB} MB: {verdict(goals['orchestrator_peak_under_300_mb'])}"))
for h in doc["hops"]:
    rows.append((f"{h['process']} RSS at {early_label} / end / peak",
                 f"{mb(h['rss_at_early_mb'])} / {mb(h['rss_at_load_end_mb'])} / {mb(h['peak_mb'])}", ""))
rows.append(("hops' RSS change, 1 min to end of load",
             ", ".join(f"{n} {d * 100:+.1f} %" for n, d in hops_drift.items()) or "-",
             f"each within 20 %: {verdict(goals['hops_early_and_end_within_20_percent'])}"))
rows.append(("run folder (du)", f"{mb(used / MB)} ({size:,} bytes apparent); peak during the run "
             f"{mb(None if peak_disk is None else peak_disk / MB)}", ""))
if tail is not None and "tail" in tail:
    rows.append(("the tail's traces (bench/jaeger_check.py)",
                 "; ".join(f"{k} {v['whole']:,} of {v['requests']:,} whole" for k, v in tail["tail"].items())
                 + f"; {tail['traces']:,} traces, {tail['orphan_traces']} with orphans, "
                 f"{tail['format_problems']} format problems",
                 f"every one whole, Jaeger's format: {verdict(goals['tail_traces_whole_and_jaeger_format'])}"))
elif tail is not None:
    rows.append(("the tail's traces", f"not checked: {tail.get('error')}", "**missed**"))
rows.append(("Jaeger file(s)",
             ", ".join(f"{p} {mb(b / MB)}" for p, b in jaeger) or "none",
             f"each at most {JAEGER_GOAL_MB} MB: {verdict(goals['each_jaeger_file_at_most_50_mb'])}"))
rows.append(("trace counts (summary.json)",
             ", ".join(f"{k.replace('variants.', '').replace('.traces.', ': ')} {v:,}"
                       for k, v in trace_counts.items()) or "none", ""))
la = doc["load_average"]
rows.append(("machine load average (1 min)",
             f"before {la['before']}, after {la['after']}, {doc['cores']} cores", ""))

print()
print(f"soak: {load.get('rate')}/s for {load.get('duration')}, 3-hop zero-work push chain, traces on; "
      f"memory sampled every {interval:g} s; run folder {run_dir or 'missing'}"
      + (" (interrupted)" if interrupted else ""))
print()
print("| measure | value | goal |")
print("|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print()
print(json.dumps(doc, separators=(",", ":")))
with open(os.path.join(out, "soak.md"), "w") as f:
    f.write("| measure | value | goal |\n|---|---|---|\n" + "".join("| " + " | ".join(r) + " |\n" for r in rows))
for path in filter(None, (os.path.join(out, "soak.json"), json_out)):
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
if interrupted:
    print(f"soak: interrupted (tailmesh run exited {run_rc}); the table covers what ran", file=sys.stderr)
elif failed:
    print(f"soak: the run failed (exit status {run_rc}{', no summary.json' if summary is None else ''})", file=sys.stderr)
if failed:
    sys.exit(1)
if not accounted:
    print("soak: not every request is accounted for", file=sys.stderr)
    sys.exit(1)
PY
say "results in $OUT"
((INTERRUPTED)) && exit 130
exit "$REPORT_RC"
