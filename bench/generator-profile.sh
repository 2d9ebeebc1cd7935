#!/usr/bin/env bash
# Where each load generator's CPU per request goes: h2load, `tailmesh load`
# and the lean client (h2lean) each drive the standalone zero-work hop of
# bench/generator.sh, closed loop, 64 in flight over 4 connections, under
# `perf record`, one after the other, ROUNDS times (the order rotating);
# prints each tool's CPU per request (its own process only: the hop's is
# not counted) split by where it was spent: the kernel, the HTTP/2 library
# (h2, nghttp2; HPACK apart), the runtime or event loop, tonic/http/bytes/
# prost, malloc and free, memmove and memcpy, tailmesh's client
# (tailmesh_services), the generator's own code and the rest (medians of
# the rounds), then each tool's top symbols. Symbols are perf's self time:
# code inlined into a function counts as that function's, and a generic
# future's poll (`Pin<P> as Future>::poll`) lands in "other".
#
# Usage: bench/generator-profile.sh [-n REQUESTS] [-r ROUNDS] [-F HZ]
#   -n N    requests per tool and round (default 100000)
#   -r R    rounds (default 2)
#   -F HZ   perf's sampling frequency (default 1999)
#
# Needs perf (Debian: linux-perf) and the permission to record (root, or
# kernel.perf_event_paranoid <= 1), cargo, python3, h2load + nghttp
# (Debian: nghttp2-client). Loopback only. Leaves nothing behind: every
# process it starts is stopped by its PID and the temp dir removed.
set -euo pipefail

BENCH=generator-profile
REQUESTS=100000
ROUNDS=2
HZ=1999
usage() { sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
    case "$1" in
        -n) REQUESTS="${2:?-n needs a number}"; shift 2 ;;
        -r) ROUNDS="${2:?-r needs a number}"; shift 2 ;;
        -F) HZ="${2:?-F needs a number}"; shift 2 ;;
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
command -v perf >/dev/null 2>&1 || { echo "$BENCH: needs perf (Debian: linux-perf)" >&2; exit 1; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=bench/lib/standalone-hop.sh
source "$HERE/lib/standalone-hop.sh"
bench_setup
say "cargo build --release -p tailmesh-bench --bin h2lean"
step TERM cargo build --release -p tailmesh-bench --bin h2lean --quiet
LEAN_BIN="$REPO/target/release/h2lean"
start_hop
check_hop
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

# perf record of one tool; $1: tool, $2: round.
record() {
    local tool=$1 r=$2 out="$TMP/$1-$2"
    local cmd
    case "$tool" in
        h2load) cmd=(h2load -n "$REQUESTS" -c 4 -m 16 -t 1 -d "$TMP/body.bin" "${GRPC_HEADERS[@]}" "$URL") ;;
        tailmesh) cmd=("$BIN" load "$ADDR" --concurrency 64 --connections 4 --requests "$REQUESTS" --warmup 0s --timeout 30s) ;;
        h2lean) cmd=("$LEAN_BIN" "$ADDR" -n "$REQUESTS" -c 4 -m 16) ;;
    esac
    say "round $r: perf record -- ${cmd[*]}"
    step TERM perf record -q -F "$HZ" -o "$out.data" -- "${cmd[@]}" >"$out.out" 2>"$out.err" || {
        say "$tool failed:"
        cat "$out.err" "$out.out" >&2
        exit 1
    }
    perf script -i "$out.data" -F comm,pid,tid,ip,sym,dso 2>/dev/null >"$out.txt"
    rm -f "$out.data"
}

TOOLS=(h2load tailmesh h2lean)
for ((r = 1; r <= ROUNDS; r++)); do
    for ((i = 0; i < ${#TOOLS[@]}; i++)); do
        record "${TOOLS[(r - 1 + i) % ${#TOOLS[@]}]}" "$r"
    done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$TMP" "$ROUNDS" "$HZ" "$REQUESTS" <<'PY'
import collections, pathlib, re, statistics, sys

out, rounds, hz, n = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
line_re = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+[0-9a-f]+\s+(.*)$")
CATEGORIES = [
    "kernel",
    "HTTP/2: HPACK",
    "HTTP/2: the rest",
    "runtime, event loop",
    "tonic, http, bytes, prost",
    "malloc, free",
    "memmove, memcpy",
    "client: tailmesh_services",
    "generator: own code",
    "other (std, core, libc, inlined generics)",
]
ALLOC = re.compile(r"^(__libc_|_int_|__rust_|__rdl_|__GI___libc_)?(malloc|free|cfree|realloc|calloc|alloc|dealloc|malloc_consolidate|unlink_chunk)\b|tcache")

def category(tool, sym, dso):
    if "kernel" in dso:
        return "kernel"
    if "hpack" in sym or sym.startswith("nghttp2_hd") or "loona_hpack" in sym:
        return "HTTP/2: HPACK"
    if sym.startswith("h2::") or "<h2::" in sym or "libnghttp2" in dso:
        return "HTTP/2: the rest"
    if "tokio::" in sym or "mio::" in sym or "libev" in dso:
        return "runtime, event loop"
    if any(k in sym for k in ("tonic::", "http::", "bytes::", "prost::")):
        return "tonic, http, bytes, prost"
    if ALLOC.search(sym):
        return "malloc, free"
    if any(k in sym for k in ("memmove", "memcpy", "memset", "memcmp")):
        return "memmove, memcpy"
    if "tailmesh_services" in sym:
        return "client: tailmesh_services"
    own = {
        "h2load": lambda: dso.rsplit("/", 1)[-1] == "h2load",
        "tailmesh": lambda: "tailmesh::" in sym or "hdrhistogram" in sym,
        "h2lean": lambda: "tailmesh_bench" in sym or "hdrhistogram" in sym,
    }[tool]
    if own():
        return "generator: own code"
    return "other (std, core, libc, inlined generics)"

def profile(tool, r):
    """CPU us per request by category, the tool's own process only."""
    per = collections.Counter()
    syms = collections.Counter()
    pids = collections.Counter()
    rows = []
    for line in open(out / f"{tool}-{r}.txt", errors="replace"):
        m = line_re.match(line)
        if not m:
            continue
        comm, pid, rest = m.group(1), int(m.group(2)), m.group(4)
        sym, _, dso = rest.rpartition(" (")
        rows.append((pid, sym.strip(), dso.rstrip(")")))
        pids[pid] += 1
    # perf runs the tool as its child: the tool is the pid with most samples.
    main = pids.most_common(1)[0][0] if pids else None
    for pid, sym, dso in rows:
        if pid != main:
            continue
        us = 1e6 / hz / n
        per[category(tool, sym, dso)] += us
        syms[sym] += us
    return per, syms

tools = ["h2load", "tailmesh", "h2lean"]
results = {t: [profile(t, r) for r in range(1, rounds + 1)] for t in tools}
print(f"\nCPU per request (us) at 64 in flight, {n} requests, {rounds} rounds (medians), sampled at {hz:.0f} Hz")
print(f"{'':<42}" + "".join(f"{t:>10}" for t in tools))
for c in CATEGORIES + ["total"]:
    cells = []
    for t in tools:
        vals = [sum(p.values()) if c == "total" else p.get(c, 0.0) for p, _ in results[t]]
        cells.append(f"{statistics.median(vals):>10.2f}")
    print(f"{c:<42}" + "".join(cells))
for t in tools:
    syms = collections.Counter()
    for _, s in results[t]:
        syms.update({k: v / rounds for k, v in s.items()})
    print(f"\n{t}: top symbols (us per request, mean of rounds)")
    for sym, us in syms.most_common(12):
        print(f"  {us:6.2f}  {sym[:110]}")
PY
