#!/usr/bin/env bash
# Where the CPU of a request through each pull backend goes, at 64 in
# flight: `pull_backends` runs one backend and one case at a time (the
# `echo` pull path; `core`, the broker's own request/reply, for NATS and
# RabbitMQ) under a system-wide `perf record` that is enabled for the
# measured requests only (not the warmup, not a server starting), ROUNDS
# times; prints CPU per request (medians of the rounds) split by who spent
# it: the producers (the bench's main thread), the worker or responder
# thread, tailmesh's broker thread, the broker server's process
# (nats-server, RabbitMQ's Erlang VM), anything else; each user and kernel
# apart; then each case's top symbols in the server and in the bench.
# CPU per request is the steadier measure on a busy machine; the
# throughput of each case is printed beside it.
#
# Usage: bench/broker-profile.sh [-n REQUESTS] [-r ROUNDS] [-F HZ] [-b BACKENDS]
#   -n N    measured requests per case and round (default 50000)
#   -r R    rounds (default 2)
#   -F HZ   perf's sampling frequency per CPU (default 999)
#   -b LIST backends, comma-separated (default tailmesh,nats,rabbitmq)
#
# Needs perf (Debian: linux-perf) and the permission to record system-wide
# (root, or kernel.perf_event_paranoid <= 0), cargo, python3, and the
# servers pull_backends starts (nats-server, rabbitmq-server; a backend
# whose server is missing is skipped). Loopback only. Leaves nothing
# behind: the processes it starts are stopped by their PID, the temp dir
# removed.
set -euo pipefail

BENCH=broker-profile
REQUESTS=50000
ROUNDS=2
HZ=999
BACKENDS=tailmesh,nats,rabbitmq
usage() { sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -F) HZ="${2:?-F needs a number}"; shift 2 ;;
        -b) BACKENDS="${2:?-b needs a list}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "$BENCH: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$REQUESTS" "$ROUNDS" "$HZ"; do
    if ! [[ $v =~ ^[1-9][0-9]*$ ]]; then
        echo "$BENCH: -n, -r and -F want positive integers, got '$v'" >&2
        exit 2
    fi
done
IFS=, read -r -a KINDS <<<"$BACKENDS"
for k in "${KINDS[@]}"; do
    case "$k" in
        tailmesh|nats|rabbitmq) ;;
        *) echo "$BENCH: -b: unknown backend '$k' (tailmesh, nats, rabbitmq)" >&2; exit 2 ;;
    esac
done
for tool in perf cargo python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$BENCH: needs $tool" >&2; exit 1; }
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
say() { echo "$BENCH: $*" >&2; }
# shellcheck source=bench/lib/wait.sh
source "$HERE/lib/wait.sh"

TMP=""
CUR_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    set +e
    if [[ -n $CUR_PID ]]; then
        # perf's child first (it stops the servers it started), then perf.
        local child
        for child in $(pgrep -P "$CUR_PID"); do
            kill -TERM "$child" 2>/dev/null
            wait_gone "$child" 100 || kill -KILL "$child" 2>/dev/null
        done
        kill -INT "$CUR_PID" 2>/dev/null
        wait_gone "$CUR_PID" 100 || kill -KILL "$CUR_PID" 2>/dev/null
        wait "$CUR_PID" 2>/dev/null
    fi
    exec 5>&- 6>&-
    [[ -n $TMP ]] && rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
TMP="$(mktemp -d)"

say "cargo build --release -p tailmesh-bench --bin pull_backends"
(cd "$REPO" && cargo build --release -p tailmesh-bench --bin pull_backends --quiet)
BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/pull_backends"

# perf's control FIFOs, held open here for reading and writing so that
# neither side's open blocks.
mkfifo "$TMP/ctl" "$TMP/ack"
exec 5<>"$TMP/ctl" 6<>"$TMP/ack"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

# RabbitMQ's Erlang VM writes its JIT's symbols to /tmp/perf-<pid>.map
# for perf; removed once read (see record).
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="${RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS:-} +JPperf map"

# One case of one backend, recorded; $1: backend, $2: case, $3: round.
record() {
    local kind=$1 case=$2 r=$3 out="$TMP/$1-$2-$3"
    say "round $r: $kind $case, 64 in flight, $REQUESTS requests"
    PULL_BACKENDS_PERF_CONTROL="$TMP/ctl,$TMP/ack" \
        perf record -q -a -F "$HZ" -D -1 --control "fifo:$TMP/ctl,$TMP/ack" -o "$out.data" -- \
        "$BIN" --backends "$kind" --cases "$case" --inflight 64 --rounds 1 \
        --requests "$REQUESTS" >"$out.out" 2>"$out.err" &
    CUR_PID=$!
    local rc=0
    wait "$CUR_PID" || rc=$?
    CUR_PID=""
    if ((rc != 0)) || grep -q 'skipped' "$out.err"; then
        say "$kind $case did not run:"
        cat "$out.err" >&2
        rm -f "$out.data"
        return 0
    fi
    perf script -i "$out.data" -F comm,pid,tid,cpu,ip,sym,dso 2>/dev/null >"$out.txt"
    rm -f "$out.data"
    # The Erlang VM's JIT map, read by perf script: removed (its pid from
    # its samples).
    local pid
    for pid in $(awk '/beam\.smp\)$/ { split($2, p, "/"); print p[1] }' "$out.txt" | sort -u); do
        rm -f "/tmp/perf-$pid.map"
    done
}

for ((r = 1; r <= ROUNDS; r++)); do
    for kind in "${KINDS[@]}"; do
        record "$kind" echo "$r"
        [[ $kind == tailmesh ]] || record "$kind" core "$r"
    done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$TMP" "$ROUNDS" "$HZ" "$REQUESTS" "${KINDS[@]}" <<'PY'
import collections, pathlib, re, statistics, sys

out, rounds, hz, n = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
kinds = sys.argv[5:]
# comm  pid/tid  [cpu]  ip  sym (dso)
line_re = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([0-9a-f]+)\s+(.*)$")

def go_symbols(path):
    """Function start addresses and names from a Go binary's .gopclntab
    (kept by strip: the Go runtime needs it), Go 1.18 and later; None if
    the file is not such a binary."""
    import bisect, struct
    try:
        data = open(path, "rb").read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def section(i):
        name, _, _, addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size
    _, stroff, _ = section(shstrndx)
    tab = None
    for i in range(shnum):
        name, off, size = section(i)
        if data[stroff + name:data.index(b"\0", stroff + name)] == b".gopclntab":
            tab = data[off:off + size]
    if tab is None or struct.unpack_from("<I", tab, 0)[0] not in (0xFFFFFFF0, 0xFFFFFFF1):
        return None
    nfunc, _, text, names_at, _, _, _, funcs_at = struct.unpack_from("<8Q", tab, 8)
    starts, names = [], []
    for i in range(nfunc):
        entry, func = struct.unpack_from("<II", tab, funcs_at + 8 * i)
        name_off, = struct.unpack_from("<i", tab, funcs_at + func + 4)
        at = names_at + name_off
        starts.append(text + entry)
        names.append(tab[at:tab.index(b"\0", at)].decode(errors="replace"))
    return lambda ip: names[bisect.bisect_right(starts, ip) - 1] if starts and ip >= starts[0] else "[unknown]"

GO = {}
def go_name(dso, ip):
    if dso not in GO:
        GO[dso] = go_symbols(dso)
    return GO[dso](ip) if GO[dso] else "[unknown]"
WHO = ["producers", "worker or responder", "tailmesh broker", "server process", "other"]

def throughput(kind, case, r):
    for line in open(out / f"{kind}-{case}-{r}.out", errors="replace"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] == kind and cells[1] == case and cells[2] == "64":
            return float(cells[5].rstrip("/s"))
    return None

def profile(kind, case, r):
    """CPU us per request by (who, user or kernel), and the top symbols."""
    path = out / f"{kind}-{case}-{r}.txt"
    if not path.exists():
        return None
    rows = []
    bench_pid = None
    for line in open(path, errors="replace"):
        m = line_re.match(line)
        if not m:
            continue
        comm, pid, ip, rest = m.group(1).strip(), int(m.group(2)), int(m.group(5), 16), m.group(6)
        sym, _, dso = rest.rpartition(" (")
        sym, dso = sym.strip(), dso.rstrip(")")
        if sym == "[unknown]" and dso.endswith("nats-server"):
            sym = go_name(dso, ip)
        if sym == "[unknown]":
            sym = f"[unnamed, in {dso.rsplit('/', 1)[-1]}]"
        rows.append((comm, pid, sym, dso))
        if comm == "pull_backends":
            bench_pid = pid
    per = collections.Counter()
    syms = {"server": collections.Counter(), "bench": collections.Counter()}
    us = 1e6 / hz / n
    for comm, pid, sym, dso in rows:
        if pid == 0 or comm == "swapper" or comm.startswith("perf"):
            continue
        space = "kernel" if "kernel" in dso else "user"
        if pid == bench_pid:
            who = {"worker": "worker or responder", "responder": "worker or responder",
                   "broker": "tailmesh broker"}.get(comm, "producers")
            if who == "tailmesh broker":
                syms["server"][sym] += us
            else:
                syms["bench"][sym] += us
        elif kind == "nats" and comm.startswith("nats-server"):
            who = "server process"
            syms["server"][sym] += us
        elif kind == "rabbitmq" and ("beam" in dso or "erts" in dso or re.match(
                r"^(\d+_)?(scheduler|dirty_|aux|erts_|beam|poll|async|sys_msg)", comm)):
            who = "server process"
            syms["server"][sym] += us
        else:
            who = "other"
        per[(who, space)] += us
    return per, syms

print(f"\nCPU per request (us) at 64 in flight, {n} measured requests per case, "
      f"{rounds} rounds (medians), all CPUs sampled at {hz:.0f} Hz; user + kernel")
cases = [(k, c) for k in kinds for c in (["echo"] if k == "tailmesh" else ["echo", "core"])]
head = "".join(f"{k + ' ' + c:>18}" for k, c in cases)
print(f"{'':<28}{head}")
results = {kc: [p for r in range(1, rounds + 1) if (p := profile(*kc, r))] for kc in cases}
rates = {kc: [t for r in range(1, rounds + 1) if (t := throughput(*kc, r))] for kc in cases}

def cell(kc, f):
    vals = [f(p) for p, _ in results[kc]]
    return f"{statistics.median(vals):>18.2f}" if vals else f"{'-':>18}"

for who in WHO:
    cells = "".join(cell(kc, lambda p, w=who: p.get((w, "user"), 0) + p.get((w, "kernel"), 0)) for kc in cases)
    kern = "".join(cell(kc, lambda p, w=who: p.get((w, "kernel"), 0)) for kc in cases)
    print(f"{who:<28}{cells}")
    print(f"{'  of which kernel':<28}{kern}")
print(f"{'total':<28}" + "".join(cell(kc, lambda p: sum(p.values())) for kc in cases))
print(f"{'throughput (req/s)':<28}" + "".join(
    f"{statistics.median(rates[kc]):>18.0f}" if rates[kc] else f"{'-':>18}" for kc in cases))
for kc in cases:
    if not results[kc]:
        continue
    for side in ("server", "bench"):
        total = collections.Counter()
        for _, s in results[kc]:
            total.update({k: v / len(results[kc]) for k, v in s[side].items()})
        print(f"\n{kc[0]} {kc[1]}, {side}: top symbols (us per request, mean of rounds)")
        for sym, v in total.most_common(10):
            print(f"  {v:6.2f}  {sym[:110]}")
PY
