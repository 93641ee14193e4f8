"""Requests per second of the upstream emulator alone, for a small non-streaming chat completion.

    .venv/bin/python loadtests/emulator_throughput.py --concurrency 32 --seconds 5

Starts the emulator in a subprocess (or uses --url) and drives it with a plain aiohttp client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memci_proxy.emulator.testing import running_emulator  # noqa: E402

BODY = json.dumps(
    {"model": "memci-emulator", "messages": [{"role": "user", "content": "Say hello [[len:16]]"}], "max_tokens": 32}
).encode()


async def drive(base_url: str, concurrency: int, seconds: float) -> tuple[int, int, float]:
    url = base_url + "/chat/completions"
    done = 0
    failed = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers={"content-type": "application/json"}) as session:
        started = time.perf_counter()
        deadline = started + seconds

        async def worker() -> None:
            nonlocal done, failed
            while time.perf_counter() < deadline:
                async with session.post(url, data=BODY) as response:
                    await response.read()
                    if response.status == 200:
                        done += 1
                    else:
                        failed += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return done, failed, elapsed


def server_cpu_seconds(port: int) -> float | None:
    """CPU seconds used so far by the emulator processes listening on ``port`` (Linux /proc), else None."""
    ticks = 0
    found = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            if b"memci_proxy.emulator" not in arguments or str(port).encode() not in arguments:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
        found = True
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def measure(base_url: str, concurrency: int, seconds: float) -> str:
    port = urlparse(base_url).port or 80
    cpu_before = server_cpu_seconds(port)
    done, failed, elapsed = asyncio.run(drive(base_url, concurrency, seconds))
    cpu_after = server_cpu_seconds(port)
    line = (
        f"emulator: {done / elapsed:.0f} requests/s ({done} ok, {failed} failed, {elapsed:.1f} s, "
        f"concurrency {concurrency})"
    )
    if cpu_before is not None and cpu_after is not None and cpu_after > cpu_before:
        line += f"; server CPU {cpu_after - cpu_before:.2f} s -> {done / (cpu_after - cpu_before):.0f} requests per CPU-second"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--url", default="", help="base URL of a running emulator (default: start one)")
    args = parser.parse_args()
    if args.url:
        print(measure(args.url.rstrip("/"), args.concurrency, args.seconds))
    else:
        with running_emulator() as base_url:
            asyncio.run(drive(base_url, args.concurrency, 0.5))  # warm-up
            print(measure(base_url, args.concurrency, args.seconds))


if __name__ == "__main__":
    main()
