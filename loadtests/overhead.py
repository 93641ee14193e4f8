"""Proxy overhead benchmark: the same request mix sent straight to the upstream emulator and through the
proxy, side by side in one run.

Starts the emulator (`memci-proxy emulate`), the proxy in pass-through mode
(MEMCI_MANAGE_CONTEXT=false), the proxy with context management (defaults; embedded database in a temporary
home) and, when installed in a separate virtualenv, a LiteLLM proxy as a peer. Each cell (target x streaming x
concurrency) runs for a bounded time with an aiohttp client that records per-request latency (and time to
first byte when streaming). `wrk` measures the req/s ceiling of the non-streaming pass-through, where the
Python client itself saturates. Prints a markdown table; --json writes the figures.

    .venv/bin/python loadtests/overhead.py               # full run (~3 min)
    .venv/bin/python loadtests/overhead.py --quick       # CI smoke (~20 s)
    .venv/bin/python loadtests/overhead.py --multi-turn  # a 60-turn chat per conversation, 1 and 8 at once
                                                              # (see loadtests/turn_overhead.py)
    .venv/bin/python loadtests/overhead.py --multi-turn --baseline-tree ../before
                                                              # + a managed proxy from another checkout, interleaved
    .venv/bin/python loadtests/overhead.py --multi-turn --long-chat   # one 600-turn chat, 0.9 MB bodies, 32k
                                                              # window: CPU per turn over turns 551-600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

try:  # the client's own event loop costs less with uvloop, as the servers' do
    from uvloop import run as run_async
except ImportError:  # pragma: no cover
    run_async = asyncio.run

MODEL = "memci-emulator"
LITELLM_BIN = Path(os.environ.get("LITELLM_BIN", "/work/litellm-venv/bin/litellm"))
TARGETS_MS = {"added_p50": 1.0, "added_ttfb_p50": 2.0, "added_p99_at_32": 5.0}
TARGET_RPS = 1500.0


# --- request mix -------------------------------------------------------------------------------------

_TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite and return the failures.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}}}},
]


TURNS = 8  # requests per conversation before a client starts a new one
TAG = b"@@TAG@@"


def _body(messages: list[dict[str, Any]], stream: bool, tools: list[dict[str, Any]] | None = None) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0}
    if tools:
        body["tools"] = tools
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def conversation_templates(stream: bool) -> list[list[bytes]]:
    """Two conversation shapes, each as its TURNS successive request bodies (each the previous one plus the
    next exchange, as a chat client or an agent sends them), with TAG standing for the conversation's id.

    chat: a team chat, user and assistant turns alternating. agent: a coding agent's loop, each request
    ending with the tool result of the assistant's previous tool call (1.6 KB each)."""
    tag = TAG.decode()
    system = {"role": "system", "content": "You are a concise assistant for a software team. " * 8}
    chat: list[bytes] = []
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": f"[{tag}] We plan the Q3 release of billing."}]
    for turn in range(TURNS):
        chat.append(_body(messages, stream))
        messages = messages + [
            {"role": "assistant", "content": f"Point {turn}: " + "the migration needs a rollback plan and an owner. " * 6},
            {"role": "user", "content": f"What about item {turn + 1}? " + "Please keep it brief. " * 3},
        ]
    agent: list[bytes] = []
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect the repository. " * 6},
        {"role": "user", "content": f"[{tag}] The test test_refund_rounding fails; find out why."},
    ]
    for turn in range(TURNS):
        agent.append(_body(messages, stream, _TOOLS))
        call_id = f"call_{turn}"
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": f"billing/module_{turn}.py"})}}]},
            {"role": "tool", "tool_call_id": call_id,
             "content": f"# module {turn}\n" + "def refund(amount):\n    return round(amount * 0.97, 1)\n" * 30},
        ]
    return [chat, agent]


class ClientScript:
    """The requests one simulated client sends: conversation after conversation, TURNS requests each,
    shapes alternating; identical whichever target it is sent to."""

    def __init__(self, client: int, templates: list[list[bytes]]) -> None:
        self.client, self.templates = client, templates
        self.conversation = self.turn = 0
        self.tag = self._tag()

    def _tag(self) -> bytes:
        return f"client {self.client} conversation {self.conversation}".encode()

    def next_body(self) -> bytes:
        shape = self.templates[self.conversation % len(self.templates)]
        body = shape[self.turn].replace(TAG, self.tag)
        self.turn += 1
        if self.turn == TURNS:
            self.turn, self.conversation = 0, self.conversation + 1
            self.tag = self._tag()
        return body


# --- processes ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess in its own process group, stopped by its id."""

    def __init__(self, name: str, cmd: list[str], health_url: str, env: dict[str, str] | None = None,
                 log_dir: Path | None = None, cwd: Path | None = None) -> None:
        self.name, self.cmd, self.health_url, self.cwd = name, cmd, health_url, cwd
        self.env = {**os.environ, **(env or {})}
        self.log_path = (log_dir or Path(tempfile.gettempdir())) / f"overhead-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout:.0f} s; see {self.log_path}:\n{self.tail()}")

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid  # also the process group id (start_new_session)

    def tracebacks(self) -> int:
        try:
            return self.log_path.read_text(errors="replace").count("Traceback (most recent call last)")
        except OSError:
            return 0

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass


# --- measurement -------------------------------------------------------------------------------------

@dataclass
class Cell:
    target: str
    stream: bool
    clients: int
    tool: str  # which client measured it: aiohttp or wrk
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    ttfb_p50_ms: float | None = None
    ttfb_p99_ms: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    added_ttfb_p50_ms: float | None = None
    added_ttfb_p99_ms: float | None = None
    rps_ratio: float | None = None
    cpu_ms_per_request: float | None = None  # CPU time of the target's processes / requests it answered
    completed: int = 0  # requests answered in the whole cell, warm-up included (the CPU figure's divisor)
    note: str = ""


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


async def run_cell(url: str, target: str, stream: bool, clients: int, duration: float, warmup: float) -> Cell:
    templates = conversation_templates(stream)
    latencies: list[float] = []
    ttfbs: list[float] = []
    errors = completed = 0
    first_error = ""
    t0 = time.perf_counter()
    measure_from, stop_at = t0 + warmup, t0 + warmup + duration
    headers = {"Content-Type": "application/json", "Authorization": "Bearer overhead-bench"}

    async def worker(session: aiohttp.ClientSession, script: ClientScript) -> None:
        nonlocal errors, first_error, completed
        while (start := time.perf_counter()) < stop_at:
            body = script.next_body()
            first = None
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    if stream:
                        async for _ in resp.content.iter_any():
                            if first is None:
                                first = time.perf_counter()
                    else:
                        await resp.read()
                    ok = resp.status == 200
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                ok, status = False, type(exc).__name__
            end = time.perf_counter()
            if ok:
                completed += 1
            if not measure_from <= end <= stop_at:
                continue  # completions inside the measured window count, whenever they started
            if not ok:
                errors += 1
                first_error = first_error or str(status)
                continue
            latencies.append(end - start)
            if first is not None:
                ttfbs.append(first - start)

    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.ensure_future(worker(session, ClientScript(c, templates))) for c in range(clients)]
        # requests still open 2 s after the window would not count: cancel them rather than wait
        _, pending = await asyncio.wait(tasks, timeout=stop_at + 2.0 - time.perf_counter())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    latencies.sort()
    ttfbs.sort()
    ms = lambda v: None if v is None else v * 1000.0  # noqa: E731
    return Cell(
        target=target, stream=stream, clients=clients, tool="aiohttp", requests=len(latencies), errors=errors,
        seconds=duration, rps=len(latencies) / duration,
        p50_ms=ms(percentile(latencies, 0.50)), p99_ms=ms(percentile(latencies, 0.99)),
        ttfb_p50_ms=ms(percentile(ttfbs, 0.50)) if stream else None,
        ttfb_p99_ms=ms(percentile(ttfbs, 0.99)) if stream else None,
        completed=completed, note=f"first error: {first_error}" if errors else "",
    )


_WRK_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(url: str, target: str, clients: int, duration: float, workdir: Path) -> Cell:
    script = workdir / "post.lua"
    body = conversation_templates(stream=False)[0][3].replace(TAG, b"wrk").decode()  # a 7-message chat
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        'wrk.headers["Authorization"] = "Bearer overhead-bench"\n'
        f"wrk.body = {json.dumps(body)}\n"
    )
    seconds = max(1, round(duration))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, timeout=seconds + 30,
    ).stdout
    cell = Cell(target=target, stream=False, clients=clients, tool="wrk", seconds=float(seconds))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        cell.rps = float(m.group(1))
    if m := re.search(r"(\d+) requests in", out):
        cell.requests = int(m.group(1))
    if m := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out):
        cell.errors = int(m.group(1))
    for q, attr in (("50", "p50_ms"), ("99", "p99_ms")):
        if m := re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
            setattr(cell, attr, float(m.group(1)) * _WRK_UNITS[m.group(2)])
    if m := re.search(r"Socket errors:.*", out):
        cell.note = m.group(0)
    cell.completed = cell.requests - cell.errors
    if cell.requests == 0:
        cell.p50_ms = cell.p99_ms = None
    return cell


# --- orchestration -----------------------------------------------------------------------------------

@dataclass
class Plan:
    clients: list[int]
    streams: list[bool]
    duration: float
    warmup: float
    rounds: int
    wrk_clients: list[int]
    targets: set[str]
    cells: list[Cell] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pgids: dict[str, int] = field(default_factory=dict)  # target -> process group of its server
    workdir: Path | None = None


DIRECT = "emulator (direct)"


def start_servers(plan: Plan, python: str, upstream: str, workdir: Path) -> dict[str, tuple[Server, str]]:
    """Every server to compare with the emulator alone, started up front: target -> (server, base URL)."""
    wanted: list[tuple[str, list[str], str, dict[str, str]]] = []
    for key, target, env in (
        ("passthrough", "proxy (pass-through)", {"MEMCI_MANAGE_CONTEXT": "false"}),
        ("managed", "proxy (managed)", {"MEMCI_HOME": str(workdir / "home")}),
    ):
        if key in plan.targets:
            port = free_port()
            cmd = [python, "-m", "memci_proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream", upstream]
            env = {"MEMCI_LOG_LEVEL": "warning", "DATABASE_URL": "", "REDIS_URL": "", **env}
            wanted.append((target, cmd, f"http://127.0.0.1:{port}", env))
    if "litellm" in plan.targets:
        if not LITELLM_BIN.exists():
            plan.skipped.append(f"LiteLLM proxy: {LITELLM_BIN} not installed")
        else:
            port = free_port()
            litellm_config(workdir / "litellm.yaml", upstream)
            cmd = [str(LITELLM_BIN), "--config", str(workdir / "litellm.yaml"), "--host", "127.0.0.1",
                   "--port", str(port), "--num_workers", "1"]
            env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
            wanted.append(("LiteLLM proxy", cmd, f"http://127.0.0.1:{port}", env))
    started: dict[str, tuple[Server, str]] = {}
    for target, cmd, root, env in wanted:
        # the proxies once ready (database up, packaged embedding model loaded): the steady state is measured
        health = root + ("/health/liveliness" if target.startswith("LiteLLM") else "/ready" if "proxy" in target
                         else "/health")
        server = Server(re.sub(r"\W+", "-", target).strip("-"), cmd, health, env, workdir)
        print(f"starting {target}", file=sys.stderr)
        try:
            server.start(timeout=120)
        except RuntimeError as exc:
            plan.skipped.append(f"{target}: {exc}")
            print(f"skipping {target}: {exc}", file=sys.stderr)
            continue
        started[target] = (server, root + "/v1")
    return started


def measure(plan: Plan, bases: dict[str, str], workdir: Path) -> None:
    """Cell by cell, the emulator alone first, then each target right after it: the comparison is made
    within seconds, so drifting background load on the machine weighs on both sides alike."""
    for round_no in range(plan.rounds):
        if plan.rounds > 1:
            print(f"round {round_no + 1}/{plan.rounds}", file=sys.stderr)
        measure_round(plan, bases, workdir)
    plan.cells = merge_rounds(plan.cells)


def merge_rounds(cells: list[Cell]) -> list[Cell]:
    """One cell per (target, stream, clients, client): medians over the rounds, counts summed."""
    groups: dict[tuple[str, bool, int, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.target, c.stream, c.clients, c.tool), []).append(c)
    merged = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
            continue
        cell = Cell(group[0].target, group[0].stream, group[0].clients, group[0].tool,
                    requests=sum(c.requests for c in group), errors=sum(c.errors for c in group),
                    seconds=sum(c.seconds for c in group), rps=statistics.median(c.rps for c in group),
                    note="; ".join(sorted({c.note for c in group if c.note})))
        cell.completed = sum(c.completed for c in group)
        for attr in ("p50_ms", "p99_ms", "ttfb_p50_ms", "ttfb_p99_ms", "cpu_ms_per_request"):
            values = [getattr(c, attr) for c in group if getattr(c, attr) is not None]
            setattr(cell, attr, statistics.median(values) if values else None)
        merged.append(cell)
    return merged


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (a server and its workers) and of
    their descendants (PostgreSQL's backends each open a session of their own, so the group alone misses them)."""
    table: dict[int, tuple[int, int, int]] = {}  # pid -> (parent, group, clock ticks)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):
            continue
    counted = {pid for pid, (_, group, _) in table.items() if group == pgid}
    grew = True
    while grew:
        more = {pid for pid, (parent, _, _) in table.items() if parent in counted and pid not in counted}
        counted |= more
        grew = bool(more)
    return sum(table[pid][2] for pid in counted) / os.sysconf("SC_CLK_TCK")


def groups_with(marker: str) -> set[int]:
    """Process groups of the processes whose command line contains ``marker`` (e.g. a detached database
    server started under the benchmark's temporary directory: its backends share its process group)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.add(os.getpgid(int(cmdline.parent.name)))
        except (OSError, ValueError):
            continue
    return found


def with_cpu(pgids: set[int], measure_cell: Any) -> Cell:
    cpu = lambda: sum(group_cpu_seconds(g) for g in pgids)  # noqa: E731
    before = cpu()
    cell = measure_cell()
    if pgids and cell.completed:
        cell.cpu_ms_per_request = (cpu() - before) * 1000.0 / cell.completed
    return cell


def target_groups(plan: Plan, target: str) -> set[int]:
    groups = {plan.pgids[target]} if target in plan.pgids else set()
    if target == "proxy (managed)" and plan.workdir is not None:
        groups |= groups_with(str(plan.workdir / "home"))  # the embedded PostgreSQL
    return groups


def measure_round(plan: Plan, bases: dict[str, str], workdir: Path) -> None:
    for stream in plan.streams:
        for clients in plan.clients:
            for target, base in bases.items():
                cell = with_cpu(target_groups(plan, target), lambda: run_async(run_cell(
                    base + "/chat/completions", target, stream, clients, plan.duration, plan.warmup)))
                plan.cells.append(cell)
                print(f"  {target:<22} stream={stream!s:<5} clients={clients:<4} {cell.rps:8.0f} req/s "
                      f"p50={fmt(cell.p50_ms)} p99={fmt(cell.p99_ms)} errors={cell.errors}", file=sys.stderr)
    if not (plan.wrk_clients and shutil.which("wrk")):
        return
    for clients in plan.wrk_clients:
        for target, base in bases.items():
            if target == "proxy (managed)":
                continue  # one wrk body is one conversation: its session lock would serialise the connections
            cell = with_cpu(target_groups(plan, target),
                            lambda: run_wrk(base + "/chat/completions", target, clients, plan.duration, workdir))
            plan.cells.append(cell)
            print(f"  {target:<22} wrk clients={clients:<4} {cell.rps:8.0f} req/s", file=sys.stderr)


def litellm_config(path: Path, upstream: str) -> None:
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}\n"
        "      api_key: overhead-bench\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )


def run(plan: Plan, python: str) -> None:
    workdir = plan.workdir = Path(tempfile.mkdtemp(prefix="memci-overhead-"))
    emu_port = free_port()
    upstream = f"http://127.0.0.1:{emu_port}/v1"
    emulator = Server("emulator", [python, "-m", "memci_proxy.cli", "emulate", "--port", str(emu_port)],
                      f"http://127.0.0.1:{emu_port}/health", log_dir=workdir)
    emulator.start(timeout=60)
    servers: dict[str, tuple[Server, str]] = {}
    try:
        servers = start_servers(plan, python, upstream, workdir)
        plan.pgids = {DIRECT: emulator.pid(), **{t: server.pid() for t, (server, _) in servers.items()}}
        measure(plan, {DIRECT: upstream, **{t: base for t, (_, base) in servers.items()}}, workdir)
    finally:
        for target, (server, _) in servers.items():
            server.stop()
            if count := server.tracebacks():
                plan.notes.append(f"{target}: {count} tracebacks in its log {server.log_path}")
        emulator.stop()
    order = [DIRECT, *servers]
    plan.cells.sort(key=lambda c: (order.index(c.target), c.tool, c.stream, c.clients))
    compare(plan.cells)
    if plan.skipped or plan.notes:
        plan.notes.append(f"server logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def compare(cells: list[Cell]) -> None:
    """Fill the added latency and req/s ratio of each cell against the emulator alone, same client, same load."""
    direct = {(c.stream, c.clients, c.tool): c for c in cells if c.target == DIRECT}
    diff = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
    for c in cells:
        base = direct.get((c.stream, c.clients, c.tool))
        if base is None or c is base:
            continue
        c.added_p50_ms, c.added_p99_ms = diff(c.p50_ms, base.p50_ms), diff(c.p99_ms, base.p99_ms)
        c.added_ttfb_p50_ms, c.added_ttfb_p99_ms = diff(c.ttfb_p50_ms, base.ttfb_p50_ms), diff(c.ttfb_p99_ms, base.ttfb_p99_ms)
        c.rps_ratio = c.rps / base.rps if base.rps else None


# --- report ------------------------------------------------------------------------------------------

def fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(cells: list[Cell]) -> str:
    head = ("| target | stream | clients | client | req/s | p50 ms | p99 ms | TTFB p50 ms | TTFB p99 ms "
            "| added p50 ms | added p99 ms | added TTFB p50 ms | req/s ratio | server CPU ms/req | errors |")
    rows = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for c in cells:
        rows.append(
            f"| {c.target} | {'yes' if c.stream else 'no'} | {c.clients} | {c.tool} | {c.rps:.0f} | {fmt(c.p50_ms)} "
            f"| {fmt(c.p99_ms)} | {fmt(c.ttfb_p50_ms)} | {fmt(c.ttfb_p99_ms)} | {fmt(c.added_p50_ms)} "
            f"| {fmt(c.added_p99_ms)} | {fmt(c.added_ttfb_p50_ms)} | {fmt(c.rps_ratio)} | {fmt(c.cpu_ms_per_request)} "
            f"| {c.errors} |"
        )
    return "\n".join(rows)


def target_checks(cells: list[Cell]) -> list[str]:
    def find(target: str, stream: bool, clients: int, tool: str = "aiohttp") -> Cell | None:
        return next((c for c in cells if (c.target, c.stream, c.clients, c.tool) == (target, stream, clients, tool)), None)

    out = []
    for target in ("proxy (pass-through)", "proxy (managed)"):
        checks = [
            ("added p50, 1 client, non-streaming", find(target, False, 1), "added_p50_ms", TARGETS_MS["added_p50"]),
            ("added TTFB p50, 1 client, streaming", find(target, True, 1), "added_ttfb_p50_ms", TARGETS_MS["added_ttfb_p50"]),
            ("added p99, 32 clients, non-streaming", find(target, False, 32), "added_p99_ms", TARGETS_MS["added_p99_at_32"]),
        ]
        for label, cell, attr, limit in checks:
            value = getattr(cell, attr) if cell else None
            if value is not None:
                out.append(f"- {target}: {label} = {value:.2f} ms (target <= {limit:g} ms): {'met' if value <= limit else 'NOT met'}")
        cpu = [c.cpu_ms_per_request for c in cells if c.target == target and not c.stream and c.clients > 1
               and c.cpu_ms_per_request]
        if cpu:
            low = min(cpu)
            out.append(f"- {target}: proxy CPU per non-streaming request (concurrent cells) {low:.2f} to {max(cpu):.2f} ms: "
                       f"one fully busy core would serve at most {1000 / low:.0f} req/s (load-independent estimate)")
        best = max((c for c in cells if c.target == target and not c.stream), key=lambda c: c.rps, default=None)
        if best:
            out.append(f"- {target}: best non-streaming req/s = {best.rps:.0f} ({best.tool}, {best.clients} clients) "
                       f"(target >= {TARGET_RPS:.0f}): {'met' if best.rps >= TARGET_RPS else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke: 1 s cells, 1 and 8 clients, no wrk")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell (default 5)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds discarded at the start of each cell")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the whole interleaved sequence; figures are medians over rounds (default 1)")
    parser.add_argument("--clients", default="1,32,256", help="concurrency levels (default 1,32,256)")
    parser.add_argument("--wrk-clients", default="32,256", help="wrk connection counts ('' to skip wrk)")
    parser.add_argument("--targets", default="passthrough,managed,litellm",
                        help="what to compare with the emulator alone (default passthrough,managed,litellm; "
                             "LiteLLM is skipped when not installed)")
    parser.add_argument("--only-streaming", choices=("yes", "no"), help="run only streaming or only non-streaming cells")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the proxy and the emulator")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    multi = parser.add_argument_group("multi-turn mode (--multi-turn)")
    multi.add_argument("--multi-turn", action="store_true",
                       help="chats resent whole each turn: direct, pass-through and managed per turn (default clients 1,8)")
    multi.add_argument("--turns", type=int, default=60, help="turns per chat (default 60)")
    multi.add_argument("--workload", choices=("team", "chat"), default="team",
                       help="team: short questions on a release plan; chat: the cache benchmark's chat, whose facts "
                            "are asked back later (pushed or recalled turns)")
    multi.add_argument("--conversations", type=int, default=2, help="chats each client runs per cell (default 2)")
    multi.add_argument("--window", type=int, default=0, help="the emulator's context length (default: its own)")
    multi.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE",
                       help="environment of both proxies, e.g. MEMCI_WRITE_BEHIND=false")
    multi.add_argument("--profile", type=Path, help="record both proxies with py-spy into this directory")
    multi.add_argument("--exchange-chars", type=int, default=0,
                       help="pad each exchange of the chat to about this many characters (default: short turns)")
    multi.add_argument("--measure-from", type=int, default=0,
                       help="turns of each chat before this one are sent but not measured (default 0)")
    multi.add_argument("--settle", type=float, default=0.0,
                       help="seconds after each cell whose CPU still counts (background work of the measured turns); "
                            "with --measure-from, the measuring also waits for the target to go idle first (the "
                            "unmeasured turns' background work is not theirs)")
    multi.add_argument("--long-chat", action="store_true",
                       help="one 600-turn chat of ~1,500 characters per exchange (0.9 MB bodies at the end), the "
                            "managed proxy's window 32k (the emulator's 1M), turns 551-600 measured plus 8 s after "
                            "(background work included)")
    multi.add_argument("--user-memory", action="store_true",
                       help="+ the managed proxy with each client's chats naming one end user (memory across its "
                            "chats: every question searches the user's other conversations)")
    multi.add_argument("--baseline-tree", type=Path, metavar="DIR",
                       help="also run a managed proxy from another checkout's source (e.g. a git worktree of the "
                            "commit before a change), interleaved with the others: an A/B of two versions in one run")
    args = parser.parse_args(argv)
    if args.multi_turn:
        if str(Path(__file__).resolve().parents[1]) not in sys.path:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from loadtests.turn_overhead import LONG_CHAT, LONG_CHAT_PROXY_WINDOW, run_multi_turn

        given = argv if argv is not None else sys.argv[1:]
        args.client_levels = [int(c) for c in args.clients.split(",") if c] if "--clients" in given else [1, 8]
        args.rounds = max(1, args.rounds)
        if args.long_chat:
            for key, value in LONG_CHAT.items():
                if f"--{key.replace('_', '-')}" not in given and not (key == "client_levels" and "--clients" in given):
                    setattr(args, key, value)
            if not any(kv.startswith("MEMCI_CONTEXT_WINDOW=") for kv in args.proxy_env):
                args.proxy_env.append(f"MEMCI_CONTEXT_WINDOW={LONG_CHAT_PROXY_WINDOW}")
        return run_multi_turn(args)

    streams = [False, True] if args.only_streaming is None else [args.only_streaming == "yes"]
    plan = Plan(
        clients=[int(c) for c in args.clients.split(",") if c], streams=streams,
        duration=args.duration, warmup=args.warmup, rounds=max(1, args.rounds),
        wrk_clients=[int(c) for c in args.wrk_clients.split(",") if c],
        targets={t.strip() for t in args.targets.split(",") if t.strip()},
    )
    if args.quick:
        plan.clients, plan.duration, plan.warmup, plan.wrk_clients, plan.rounds = [1, 8], 1.0, 0.2, [], 1
    if plan.wrk_clients and not shutil.which("wrk"):
        plan.skipped.append("wrk rows: wrk not installed (apt-get install -y wrk)")

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    run(plan, args.python)
    print(f"## Proxy overhead, {started}, {os.cpu_count()} CPUs, {plan.duration:g} s per cell"
          f"{f', medians of {plan.rounds} rounds' if plan.rounds > 1 else ''}\n")
    print(markdown(plan.cells))
    print("\nTargets:")
    print("\n".join(target_checks(plan.cells)) or "- no comparable cells")
    for note in plan.skipped:
        print(f"\nSkipped: {note.splitlines()[0]}")
    for note in plan.notes:
        print(f"\nNote: {note}")
    if args.json:
        args.json.write_text(json.dumps({"started": started, "cpus": os.cpu_count(), "duration_s": plan.duration, "rounds": plan.rounds,
                                         "argv": sys.argv, "cells": [asdict(c) for c in plan.cells],
                                         "skipped": plan.skipped, "notes": plan.notes}, indent=2))
    failed = [c for c in plan.cells if c.requests == 0 and c.target.startswith(("emulator", "proxy"))]
    return 1 if failed or not plan.cells else 0


if __name__ == "__main__":
    sys.exit(main())
