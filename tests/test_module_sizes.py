"""No source module over 600 lines (the rule issue 15 set and issue 40 restored): a module past it is doing more
than one job, and the layout stops telling a reader where a job lives."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 600


def source_modules() -> list[Path]:
    roots = [*REPO.glob("packages/*/src"), REPO / "benchmarks" / "src"]
    return sorted(p for root in roots for p in root.rglob("*.py"))


def test_no_source_module_is_over_600_lines() -> None:
    modules = source_modules()
    assert any(p.name == "loop.py" for p in modules) and any(p.name == "app.py" for p in modules)
    over = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them by job): {over}"
