"""Exponential back-off of failed summaries (seed 001): 10m, 30m, 2h, 6h, 12h; after the fifth failure an
``archive_backlog`` event, and the retries go on every 12 hours. Pure: the caller passes the clock."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

BACKOFF_STEPS: tuple[dt.timedelta, ...] = (
    dt.timedelta(minutes=10),
    dt.timedelta(minutes=30),
    dt.timedelta(hours=2),
    dt.timedelta(hours=6),
    dt.timedelta(hours=12),
)
MAX_ATTEMPTS = 5
BACKLOG_EVENT = "archive_backlog"


@dataclass(frozen=True)
class RetryPlan:
    attempts: int  # failures so far, this one included
    next_attempt_at: dt.datetime
    backlog: bool  # this failure is the one that reaches MAX_ATTEMPTS: record an archive_backlog event


def after_failure(previous_attempts: int, now: dt.datetime) -> RetryPlan:
    """When to try again after one more failure (``previous_attempts`` failures before it)."""
    attempts = previous_attempts + 1
    step = BACKOFF_STEPS[min(attempts, len(BACKOFF_STEPS)) - 1]
    return RetryPlan(attempts, now + step, attempts == MAX_ATTEMPTS)
