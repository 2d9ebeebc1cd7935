"""bench/scale.sh's helper: the call graph of N services in Alibaba's
format, one round's numbers read from a run's folder, and the closing
table.

  scale.py calls N OUT               write the call graph of N services
  scale.py round RUN_DIR N TSV JSONL  append the round's values (TSV for the
                                     intervals binary, JSONL for the table);
                                     exit 1 when a request is unaccounted
                                     for or the traces are missing
  scale.py report JSONL [JSON]       print the medians per size
"""

import json
import os
import statistics
import sys

FAN_OUT = 10


def tree(n):
    """Each service's children: the entry has FAN_OUT - 1, the others up to
    FAN_OUT, breadth first (so 100 services are 1 + 9 + 90, depth 3)."""
    children = {i: [] for i in range(n)}
    nxt = 1
    for i in range(n):
        room = FAN_OUT - 1 if i == 0 else FAN_OUT
        while nxt < n and len(children[i]) < room:
            children[i].append(nxt)
            nxt += 1
    return children


def calls(n, out):
    """500 requests through the tree over 10 s (50/s), as Alibaba's
    MSCallGraph rows (timestamp, traceid, service, rpc_id, um,
    uminstanceid, rpctype, interface, dm, dminstanceid, rt in ms): each
    service works 1 ms and calls its children side by side; a leaf is
    called by 90 % of its caller's requests, one leaf in ten twice in a
    row. Seeded: the same graph every time."""
    import random

    rng = random.Random(7)
    children = tree(n)
    rows = ["timestamp,traceid,service,rpc_id,um,uminstanceid,rpctype,interface,dm,dminstanceid,rt"]

    def visit(trace, node, rpc, caller, at):
        """Rows of node's call at `at` (ms) by `caller`; returns its rt."""
        start, own = at, 1
        t = start + own
        ends = [t]
        k = 0
        for child in children[node]:
            leaf = not children[child]
            if leaf and rng.random() >= 0.9:
                continue
            times = 2 if leaf and child % 10 == 3 else 1
            c_at = t
            for _ in range(times):
                k += 1
                rt = visit(trace, child, f"{rpc}.{k}", node, c_at)
                c_at += rt
            ends.append(c_at)
        rt = max(ends) - start
        um = "USER" if caller is None else f"s{caller}"
        rows.append(f"{start},{trace},s,{rpc},{um},{um}-0,rpc,call,s{node},s{node}-0,{rt}")
        return rt

    for i in range(500):
        visit(f"t{i}", 0, "0.1", None, i * 20)
    with open(out, "w") as f:
        f.write("\n".join(rows) + "\n")


def round_values(run_dir, n, tsv, jsonl):
    with open(os.path.join(run_dir, "summary.json")) as f:
        variant = json.load(f)["variants"][0]
    if not variant.get("accounted"):
        sys.exit(f"scale: {n} services: not every request is accounted for: {run_dir}")
    traces = os.path.join(run_dir, "traces.jaeger.json")
    if not os.path.exists(traces) or os.path.getsize(traces) == 0:
        sys.exit(f"scale: {n} services: no traces written: {traces}")
    memory = variant.get("peak_memory", [])
    hops = sorted(m["peak_rss_bytes"] for m in memory if m["process"].startswith("hop-"))
    if len(hops) != n:
        sys.exit(f"scale: {n} services: peak memory of {len(hops)} hop processes, not {n}")
    orchestrator = [m["peak_rss_bytes"] for m in memory if m["process"] == "orchestrator"]
    row = {
        "services": n,
        "ready_s": variant["launch_s"],
        "rss_bytes": sum(m["peak_rss_bytes"] for m in memory),
        "hop_rss_bytes": statistics.median(hops),
        "orchestrator_rss_bytes": orchestrator[0] if orchestrator else None,
        "sent": variant["sent"],
        "traces_bytes": os.path.getsize(traces),
    }
    with open(tsv, "a") as f:
        f.write(f"ready s, {n} services\t{row['ready_s']}\n")
        f.write(f"RSS GB, {n} services\t{row['rss_bytes'] / 1e9}\n")
        f.write(f"hop RSS MB, {n} services\t{row['hop_rss_bytes'] / 1e6}\n")
    with open(jsonl, "a") as f:
        f.write(json.dumps(row) + "\n")


def report(jsonl, out=None):
    with open(jsonl) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    sizes = sorted({r["services"] for r in rows})
    table = []
    print("| services | ready | all processes' peak RSS | hop peak RSS | orchestrator peak RSS | requests | traces file |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        mine = [r for r in rows if r["services"] == n]
        med = lambda key: statistics.median(r[key] for r in mine if r[key] is not None)
        line = {
            "services": n,
            "rounds": len(mine),
            "ready_s": med("ready_s"),
            "rss_gb": med("rss_bytes") / 1e9,
            "hop_rss_mb": med("hop_rss_bytes") / 1e6,
            "orchestrator_rss_mb": med("orchestrator_rss_bytes") / 1e6,
            "requests": med("sent"),
            "traces_mb": med("traces_bytes") / 1e6,
        }
        table.append(line)
        print(
            f"| {n} | {line['ready_s']:.2f} s | {line['rss_gb']:.2f} GB | {line['hop_rss_mb']:.1f} MB"
            f" | {line['orchestrator_rss_mb']:.0f} MB | {line['requests']:.0f} | {line['traces_mb']:.0f} MB |"
        )
    print("medians of the rounds; every request accounted for in every round")
    if out:
        with open(out, "w") as f:
            json.dump({"sizes": table, "rounds": rows}, f, indent=2)


def main(argv):
    if len(argv) >= 3 and argv[0] == "calls":
        calls(int(argv[1]), argv[2])
    elif len(argv) == 5 and argv[0] == "round":
        round_values(argv[1], int(argv[2]), argv[3], argv[4])
    elif len(argv) in (2, 3) and argv[0] == "report":
        report(argv[1], argv[2] if len(argv) == 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
