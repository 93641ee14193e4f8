"""cache_bench's pictures: one PNG per workload, hit rate and prompt size per turn (request) for every strategy.

matplotlib (a test extra) with the Agg backend: no display needed. Without matplotlib the plots are skipped
with a note on stderr, and the tables are printed as before.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(__file__).resolve().parent / "out"  # ignored by git


def per_request(records: Sequence[Any]) -> tuple[list[int], list[float], list[float]]:
    """Request numbers (1-based: a chat's turns; an agent loop's steps), each request's hit rate (cached / prompt
    tokens over its upstream prompts) and its largest upstream prompt; NaN where the request failed."""
    nan = float("nan")
    hit = [r.cached / r.prompt if r.prompt and not r.error else nan for r in records]
    largest = [float(r.prompt_largest) if not r.error else nan for r in records]
    return list(range(1, len(records) + 1)), hit, largest


def plot_workload(path: Path, title: str, rows: Sequence[Any], budget: int) -> Path | None:
    """Write the workload's PNG (rows: cache_bench.Row with .strategy, .hit_rate and .records); None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install -e '.[test]')", file=sys.stderr)
        return None
    fig, (hits, sizes) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for row in rows:
        numbers, hit, largest = per_request(row.records)
        hits.plot(numbers, hit, label=f"{row.strategy} ({row.hit_rate:.3f})", linewidth=1)
        peak = max((x for x in largest if x == x), default=0.0)  # NaN != NaN
        clipped = f" (up to {peak:,.0f}, off the top)" if peak > 1.5 * budget else ""
        sizes.plot(numbers, largest, label=row.strategy + clipped, linewidth=1)
    sizes.axhline(budget, color="black", linestyle="--", linewidth=0.8, label=f"budget {budget:,}")
    hits.set_ylabel("prefix-cache hit rate")
    hits.set_ylim(-0.02, 1.02)
    hits.set_title(title)
    hits.legend(loc="center right", fontsize=8, title="strategy (token-weighted hit rate)", title_fontsize=8)
    sizes.set_ylim(0, 1.5 * budget)  # the bounded strategies' saw-teeth stay readable next to an unbounded one
    sizes.set_ylabel("largest upstream prompt (tokens)")
    sizes.set_xlabel("request (a chat's turns, an agent's steps)")
    sizes.legend(loc="upper left", fontsize=8)
    for ax in (hits, sizes):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
