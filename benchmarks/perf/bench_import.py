"""`import agl` stays light: wall time and peak RSS of a fresh interpreter that imports it.

Target: ≤ 1 s and ≤ 100 MB RSS. The bare interpreter is measured in the same run, for scale.
"""

from __future__ import annotations

import subprocess
import sys

from _common import median, report

# Peak RSS from VmHWM (the high-water mark of this process's own memory map): ru_maxrss would be wrong here,
# because Linux carries the parent's peak across fork and exec, so a child would report the benchmark's size.
PROBE = (
    "import time; t = time.perf_counter(); {stmt}; dt = time.perf_counter() - t; import sys; "
    "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
    "print(dt, int(hwm) / 1024, len(sys.modules))"
)


def measure(stmt: str, repeats: int) -> tuple[float, float, int]:
    times, rss, modules = [], [], 0
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(stmt=stmt)], capture_output=True, text=True, check=True
        )
        dt, mb, n = out.stdout.split()
        times.append(float(dt))
        rss.append(float(mb))
        modules = int(n)
    return median(times), median(rss), modules


def main(repeats: int = 7) -> dict[str, float]:
    bare_t, bare_mb, bare_n = measure("pass", repeats)
    agl_t, agl_mb, agl_n = measure("import agl", repeats)
    api_t, api_mb, _ = measure("import agl; agl.rollout; agl.agent; agl.emit_reward", repeats)
    rows = {
        "import agl: seconds (median)": agl_t,
        "import agl: peak RSS MB": agl_mb,
        "import agl: modules loaded beyond bare": agl_n - bare_n,
        "agl + decorator/tracing API: seconds": api_t,
        "agl + decorator/tracing API: peak RSS MB": api_mb,
        "bare interpreter: peak RSS MB": bare_mb,
        "target: seconds ≤": 1.0,
        "target: RSS MB ≤": 100.0,
        "meets target": agl_t <= 1.0 and agl_mb <= 100.0 and api_t <= 1.0 and api_mb <= 100.0,
    }
    _ = bare_t
    report("import", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(repeats=1)


if __name__ == "__main__":
    main()
