#!/usr/bin/env python3
"""Checks a run folder's Jaeger files and the tail's traces in them.

- Format: each file loads in Jaeger's UI as its JSON upload takes it (the
  query API's shape): {"data": [trace...]}, each trace with its traceID,
  spans and processes, each span with traceID (its trace's), spanID,
  operationName, references, startTime and duration (integers, us),
  tags (each a key, a type and a value), logs, and a processID its
  trace's processes name.
- Orphans: a span whose reference names a span not in its trace.
- The tail: every slow (latency above the check's slow threshold),
  failed or retried request of requests.csv has its trace in the files
  (by the load generator's root span's request_id), without orphans; an
  ok one's trace has at least one server span per record of its path
  (hedges and retries add more).

Usage: bench/jaeger_check.py RUN_DIR [--json]
Prints one line per finding and a summary; exits 1 when any check fails.
"""

import csv
import glob
import json
import os
import sys

SPAN_KEYS = ("traceID", "spanID", "operationName", "references", "startTime", "duration", "tags", "logs",
             "processID")


def load_traces(run_dir):
    """(file, trace) for every trace of the run's Jaeger files."""
    for path in sorted(glob.glob(os.path.join(run_dir, "*.jaeger.json"))):
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            yield path, None
            continue
        for trace in doc["data"]:
            yield path, trace


def trace_problems(trace):
    """What in one trace Jaeger's UI would refuse or show as broken."""
    problems = []
    if not isinstance(trace, dict):
        return ["not an object"]
    tid, spans, processes = trace.get("traceID"), trace.get("spans"), trace.get("processes")
    if not isinstance(tid, str) or not tid:
        problems.append("no traceID")
    if not isinstance(spans, list) or not spans:
        return problems + ["no spans"]
    if not isinstance(processes, dict):
        return problems + ["no processes"]
    ids = {s.get("spanID") for s in spans if isinstance(s, dict)}
    for s in spans:
        missing = [k for k in SPAN_KEYS if k not in s]
        if missing:
            problems.append(f"span {s.get('spanID')}: no {', '.join(missing)}")
            continue
        if s["traceID"] != tid:
            problems.append(f"span {s['spanID']}: traceID {s['traceID']} in trace {tid}")
        if not isinstance(s["startTime"], int) or not isinstance(s["duration"], int):
            problems.append(f"span {s['spanID']}: startTime and duration must be integers")
        if any(not {"key", "type", "value"} <= set(t) for t in s["tags"]):
            problems.append(f"span {s['spanID']}: a tag without its key, type or value")
        if s["processID"] not in processes:
            problems.append(f"span {s['spanID']}: processID {s['processID']} not among the processes")
        for r in s["references"]:
            if r.get("spanID") not in ids:
                problems.append(f"span {s['spanID']}: orphan, its {r.get('refType')} {r.get('spanID')} is not in the trace")
    return problems


def tag(span, key):
    for t in span.get("tags", []):
        if t.get("key") == key:
            return t.get("value")
    return None


def slow_threshold_us(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    for node in (summary.get("scenario"), summary.get("check"), summary):
        if isinstance(node, dict) and isinstance(node.get("slow_threshold_us"), (int, float)):
            return node["slow_threshold_us"]
    raise SystemExit(f"{run_dir}/summary.json: no slow_threshold_us")


def check(run_dir):
    """The findings as a dict (see the module's doc)."""
    traces = {}
    files = set()
    malformed = []
    orphan_traces = 0
    for path, trace in load_traces(run_dir):
        files.add(os.path.basename(path))
        if trace is None:
            malformed.append(f"{os.path.basename(path)}: not {{\"data\": [...]}}")
            continue
        problems = trace_problems(trace)
        if any("orphan" in p for p in problems):
            orphan_traces += 1
        malformed.extend(f"{os.path.basename(path)} trace {trace.get('traceID')}: {p}" for p in problems)
        for s in trace.get("spans", []):
            rid = tag(s, "request_id")
            if rid is not None and not s.get("references"):
                servers = sum(1 for x in trace["spans"] if tag(x, "span.kind") == "server")
                traces[int(rid)] = (servers, not problems)
    threshold = slow_threshold_us(run_dir)
    tail = {"slow": [0, 0], "failed": [0, 0], "retried": [0, 0]}
    incomplete = []
    with open(os.path.join(run_dir, "requests.csv"), newline="") as f:
        for row in csv.DictReader(f):
            ok = row["status"] == "ok"
            kinds = [k for k, is_kind in (
                ("slow", ok and float(row["latency_us"]) > threshold),
                ("failed", not ok),
                ("retried", row.get("retried") == "1"),
            ) if is_kind]
            if not kinds:
                continue
            rid = int(row["id"])
            found = traces.get(rid)
            records = len(row["path"].split(";")) if row["path"] else 0
            whole = found is not None and found[1] and (not ok or found[0] >= records)
            for k in kinds:
                tail[k][0] += 1
                tail[k][1] += whole
            if not whole and len(incomplete) < 20:
                incomplete.append(f"request {rid} ({', '.join(kinds)}): "
                                  + ("no trace" if found is None else f"{found[0]} server spans for {records} path records"
                                     + ("" if found[1] else ", broken")))
    return {
        "files": sorted(files),
        "traces": len(traces),
        "orphan_traces": orphan_traces,
        "format_problems": len(malformed),
        "format_examples": malformed[:20],
        "tail": {k: {"requests": n, "whole": w} for k, (n, w) in tail.items()},
        "incomplete_examples": incomplete,
        "ok": not malformed and all(n == w for n, w in tail.values()) and bool(files),
    }


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 1:
        print(__doc__.strip().split("\n\n")[-1], file=sys.stderr)
        sys.exit(2)
    found = check(args[0])
    if "--json" in sys.argv:
        print(json.dumps(found, indent=2))
    else:
        for line in found["format_examples"] + found["incomplete_examples"]:
            print(line)
        t = found["tail"]
        print(f"{found['traces']} traces in {', '.join(found['files']) or 'no Jaeger file'}; "
              f"{found['orphan_traces']} with orphans, {found['format_problems']} format problems; "
              + "; ".join(f"{k}: {v['whole']} of {v['requests']} whole" for k, v in t.items()))
    sys.exit(0 if found["ok"] else 1)


if __name__ == "__main__":
    main()
