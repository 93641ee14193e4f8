"""What each API's codec costs a managed turn: the same conversations through chat completions, the Responses API
(whole input resent, and chained by previous_response_id) and Anthropic Messages, interleaved turn by turn against
one managed proxy and one emulator, in one run. Prints each API's p50 and mean turn time and its ratio to chat
completions' (this machine's timings drift between runs; the ratios are what to compare).

    python loadtests/api_overhead.py --turns 60 --conversations 4
    python loadtests/api_overhead.py --store-ab        # Responses with store true against store false, interleaved
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from loadtests import api_clients
from loadtests.api_clients import APIS, ApiClient
from loadtests.bench_servers import emulator_upstream, proxy_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--conversations", type=int, default=4, help="conversations per API")
    parser.add_argument("--window", type=int, default=32768)
    parser.add_argument("--no-store", action="store_true",
                        help="'store': false on the stateless Responses requests (no answer chain kept)")
    parser.add_argument("--proxy-src", type=Path, default=None, help="run the proxy from this source tree")
    parser.add_argument("--store-ab", action="store_true",
                        help="only the stateless Responses requests, 'store': true against false, interleaved")
    args = parser.parse_args(argv)
    api_clients.RESPONSES_STORE = False if args.no_store else None
    series = [("responses store=true", "responses", True), ("responses store=false", "responses", False)] \
        if args.store_ab else [(api, api, None) for api in APIS]
    times: dict[str, list[float]] = {name: [] for name, _, _ in series}
    with tempfile.TemporaryDirectory(prefix="api-overhead-") as tmp, \
            emulator_upstream(args.window, Path(tmp)) as upstream, \
            proxy_server(upstream.base_url, Path(tmp) / "home", {}, args.proxy_src) as proxy_url, httpx.Client(timeout=60) as http:
        runs = [(name, ApiClient(api, http, store), [{"role": "system", "content": f"You are assistant {name} {n}."}])
                for n in range(args.conversations) for name, api, store in series]
        for turn in range(args.turns):
            for api, client, history in runs:
                history.append({"role": "user", "content": f"Turn {turn} of this conversation, tell me more. [[len:40]]"})
                started = time.perf_counter()
                status, data, _ = client.post(proxy_url, {"model": "m", "messages": history, "max_tokens": 100})
                elapsed = time.perf_counter() - started
                if status != 200:
                    raise SystemExit(f"{api}: {status} {data}")
                if turn >= 2:  # the first turns create the conversations
                    times[api].append(elapsed)
                message = data["choices"][0]["message"]
                history.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
    first = series[0][0]
    base = statistics.median(times[first])
    print(f"{args.conversations} conversations x {args.turns} turns per API, interleaved; turn time in ms")
    print(f"| API | p50 | mean | p50 / {first} | p50 - {first} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, _, _ in series:
        p50 = statistics.median(times[name])
        print(f"| {name} | {1000 * p50:.2f} | {1000 * statistics.fmean(times[name]):.2f} | {p50 / base:.2f} "
              f"| {1000 * (p50 - base):+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
