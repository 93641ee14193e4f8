"""Figures of the peers benchmark (``peers.py``): per-request records summed into one row per workload and target,
the markdown table, and the issue's CPU target read off the rows. Pure: no servers, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, MANAGED, LITELLM, HEADROOM = "proxy (pass-through)", "proxy (managed)", "LiteLLM proxy", "Headroom"
TARGET_KEYS = {"passthrough": PASS, "managed": MANAGED, "litellm": LITELLM, "headroom": HEADROOM}


@dataclass
class RequestRecord:
    """One client request through a target, and the same body straight to the direct emulator."""

    step: int
    seconds: float  # through the target, until the whole answer was read
    direct_seconds: float | None  # the same body straight to an emulator (None: that request failed)
    cpu_seconds: float  # the target's process tree CPU during the request
    error: str = ""


@dataclass
class Totals:
    """What a target's own emulator received over the measured requests (its counters after minus before)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class Row:
    workload: str
    target: str
    requests: int = 0
    errors: int = 0
    cpu_ms_per_request: float | None = None  # whole run: the tree's CPU from the first request to the settle's end
    cpu_ms_in_requests: float | None = None  # only while the target's own requests were open
    database_cpu_ms_per_request: float | None = None  # of the whole run's, the embedded PostgreSQL's
    p50_ms: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    upstream_requests: int = 0
    prompt_tokens: int = 0
    prompt_tokens_per_request: float | None = None
    cached_share: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of unsorted values (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(workload: str, target: str, records: list[RequestRecord], run_cpu_seconds: float | None,
              totals: Totals, database_cpu_seconds: float | None = None) -> Row:
    """One row: CPU per request (whole run and within requests), added latency over the successful requests whose
    direct twin also succeeded (per-request differences, then their percentiles), upstream tokens and cached share."""
    ok = [r for r in records if not r.error]
    row = Row(workload, target, requests=len(records), errors=len(records) - len(ok))
    if ok:
        if run_cpu_seconds is not None:
            row.cpu_ms_per_request = run_cpu_seconds * 1000.0 / len(ok)
        if database_cpu_seconds is not None:
            row.database_cpu_ms_per_request = database_cpu_seconds * 1000.0 / len(ok)
        row.cpu_ms_in_requests = sum(r.cpu_seconds for r in records) * 1000.0 / len(ok)
        row.p50_ms = _ms(percentile([r.seconds for r in ok], 0.50))
        added = [r.seconds - r.direct_seconds for r in ok if r.direct_seconds is not None]
        row.added_p50_ms, row.added_p99_ms = _ms(percentile(added, 0.50)), _ms(percentile(added, 0.99))
    row.upstream_requests, row.prompt_tokens = totals.requests, totals.prompt_tokens
    if ok:
        row.prompt_tokens_per_request = totals.prompt_tokens / len(ok)
    if totals.prompt_tokens:
        row.cached_share = totals.cached_tokens / totals.prompt_tokens
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


COLUMNS = ("workload", "target", "requests", "errors", "CPU ms/req (whole run; of it database)",
           "CPU ms/req (in requests)", "p50 ms", "added p50 ms", "added p99 ms", "upstream requests",
           "prompt tokens upstream", "prompt tokens/req", "cached share")


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        database = "" if r.database_cpu_ms_per_request is None else f" ({_f(r.database_cpu_ms_per_request)})"
        cells = [r.workload, r.target, str(r.requests), str(r.errors), _f(r.cpu_ms_per_request) + database,
                 _f(r.cpu_ms_in_requests), _f(r.p50_ms), _f(r.added_p50_ms), _f(r.added_p99_ms),
                 str(r.upstream_requests), f"{r.prompt_tokens:,}", _f(r.prompt_tokens_per_request, 0),
                 _share(r.cached_share)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_target(rows: list[Row]) -> list[str]:
    """The issue's target: the managed proxy's CPU per request at most LiteLLM proxy's on the chat workload and
    below it on the agent workload (whole-run figures, which include the managed proxy's background work)."""
    out = []
    for workload, strict in (("chat", False), ("agent", True)):
        managed = next((r for r in rows if r.workload == workload and r.target == MANAGED), None)
        litellm = next((r for r in rows if r.workload == workload and r.target == LITELLM), None)
        if managed is None or litellm is None or managed.cpu_ms_per_request is None \
                or litellm.cpu_ms_per_request is None:
            out.append(f"- {workload}: no managed and LiteLLM rows to compare")
            continue
        mine, theirs = managed.cpu_ms_per_request, litellm.cpu_ms_per_request
        met = mine < theirs if strict else mine <= theirs
        out.append(f"- {workload}: managed {mine:.2f} ms CPU per request vs LiteLLM proxy {theirs:.2f} ms "
                   f"({mine / theirs:.2f}x; target {'<' if strict else '<='} LiteLLM's): "
                   f"{'met' if met else 'NOT met'}")
    return out
