"""Copies a scenario file with its [load] duration replaced.

Usage: python3 bench/lib/set-duration.py SRC DURATION DST
Fails, naming SRC, when it has no [load] duration to replace.
"""
import re
import sys

src, duration, dst = sys.argv[1:]
lines, section, done = [], None, False
for line in open(src):
    m = re.match(r"\s*\[\[?([^\]]+)\]\]?", line)
    if m:
        section = m.group(1).strip()
    if section == "load" and re.match(r"\s*duration\s*=", line):
        line, done = f'duration = "{duration}"\n', True
    lines.append(line)
if not done:
    sys.exit(f"{src}: no [load] duration to replace")
open(dst, "w").writelines(lines)
