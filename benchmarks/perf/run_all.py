"""Run every performance benchmark of agl in one go and print a summary (`make bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_credit
import bench_dashboard
import bench_e2e
import bench_engine
import bench_import
import bench_memory
import bench_proxy
import bench_spans
import bench_train_step


def main() -> None:
    results = {
        "import": bench_import.main(),
        "span ingestion": bench_spans.main(),
        "proxy overhead": bench_proxy.main(),
        "end to end": bench_e2e.main(),
        "credit assignment": bench_credit.main(),
        "dashboard at 100k": bench_dashboard.main(),
        "engine throughput": bench_engine.main(),
        "GRPO step vs TRL": bench_train_step.main(),
        "main job memory": bench_memory.main([]),
    }
    print("\n== summary")
    for name, rows in results.items():
        print(f"  {name:<20} {'meets target' if rows['meets target'] else 'MISSES target'}")


if __name__ == "__main__":
    main()
