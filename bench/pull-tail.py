#!/usr/bin/env python3
"""Where the slow requests of a two-hop run (front -> worker) spent their
time, from the run's traces.jaeger.json: per variant, the requests slower
than a threshold, split by the worker replica that served them and by the
leg that took longest:

  submit    front's client span start -> broker's queue-wait span start (pull)
  queue     the broker's queue wait (pull)
  delivery  dispatch (push: the client span start) -> the worker's server span start
  service   the worker's server span
  reply     the worker's server span end -> front's client span end

Usage: bench/pull-tail.py RUN_DIR [THRESHOLD_MS]   (default 50 ms)
"""
import collections
import json
import sys

run = sys.argv[1]
threshold_us = float(sys.argv[2] if len(sys.argv) > 2 else 50) * 1000
data = json.load(open(f"{run}/traces.jaeger.json"))["data"]


def tags(span):
    return {t["key"]: t["value"] for t in span["tags"]}


rows = []
for trace in data:
    by_op = {}
    for s in trace["spans"]:
        by_op.setdefault(s["operationName"], s)
    root = next((s for op, s in by_op.items() if op.startswith("request ")), None)
    client = by_op.get("front -> worker")
    server = by_op.get("worker")
    if not (root and client and server):
        continue
    t = tags(server)
    queue = by_op.get("queue wait worker")
    cs, ce = client["startTime"], client["startTime"] + client["duration"]
    ws, we = server["startTime"], server["startTime"] + server["duration"]
    legs = {"service": we - ws, "reply": ce - we}
    if queue:
        qs, qe = queue["startTime"], queue["startTime"] + queue["duration"]
        legs.update(submit=qs - cs, queue=qe - qs, delivery=ws - qe)
    else:
        legs.update(delivery=ws - cs)
    rows.append((t["variant"], t["replica"], root["duration"], legs))

for variant in sorted({r[0] for r in rows}):
    mine = [r for r in rows if r[0] == variant]
    slow = [r for r in mine if r[2] > threshold_us]
    print(f"{variant}: {len(slow)} of {len(mine)} traced requests over {threshold_us / 1000:.0f} ms")
    per = collections.Counter((r[1], max(r[3], key=r[3].get)) for r in slow)
    for (replica, leg), n in sorted(per.items()):
        took = sorted(r[3][leg] / 1000 for r in slow if r[1] == replica and max(r[3], key=r[3].get) == leg)
        print(f"  replica {replica}, longest leg {leg:8}: {n:3} requests, that leg {took[0]:.0f}..{took[-1]:.0f} ms (median {took[len(took) // 2]:.0f})")
    served = collections.Counter(r[1] for r in mine)
    print("  requests per replica:", dict(sorted(served.items())))
