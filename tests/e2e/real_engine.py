"""A real (small) engine for end-to-end tests: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct,
built by the shared tool `../shared/tools/real-llm.sh` (relative to the repository root; `MEMCI_REAL_LLM_SCRIPT`
names another copy) and cached in `~/.cache/memci-real-llm` (`MEMCI_REAL_LLM_DIR`) between runs.

What it gives the tests that the emulator cannot: a real tokenizer and chat template, real `prompt_tokens`, a real
context limit (400 past `n_ctx`), one slot of prefix reuse, a server that validates message shapes, and its own log of
prefix reuse ("Llama.generate: N prefix-match hit, remaining M prompt tokens to eval"), read by `engine_reuse`.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.proxyproc import REPO, LoggedServer, free_port

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD_TIMEOUT_S = 1800  # the first build compiles llama.cpp (about 6-10 minutes on 2 cores)


def build_script() -> Path | None:
    """The build script (None: not there, as in a clone without the shared tools beside it)."""
    named = os.environ.get("MEMCI_REAL_LLM_SCRIPT")
    script = Path(named) if named else REPO.parent / "shared" / "tools" / "real-llm.sh"
    return script if script.is_file() else None


def build_lock(script: Path) -> Path:
    """The lock a build of ``script`` holds: scripts/test.sh starts the engines' builds in the background under the
    same lock before the tests run, and a test that needs an engine waits for that build rather than starting a
    second one beside it."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"memci-build-{script.stem}.lock"


def build(script: Path) -> Path:
    """Build the engine (or find it cached, or wait for the build scripts/test.sh started); returns the directory
    holding venv/ and the model."""
    with open(build_lock(script), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


class RealEngine(LoggedServer):
    """llama-cpp-python's server as a process; its log (stdout and stderr) in `log_path`."""

    def __init__(self, directory: Path, log_path: Path, n_ctx: int = 2048, alias: str = "smollm2") -> None:
        self.directory = directory
        self.log_path = log_path
        self.n_ctx = n_ctx
        self.alias = alias
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "RealEngine":
        d = self.directory
        self.spawn(
            [str(d / "venv" / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(d / MODEL_FILE),
             "--model_alias", self.alias, "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
             "--n_threads", "1", "--n_threads_batch", "2", "--seed", "7"],
            self.url + "/v1/models", timeout, "the real engine")
        return self


_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
_FULL = re.compile(r"Llama\.generate: full prompt already cached")
_EVAL = re.compile(r"llama_perf_context_print: +prompt eval time = +[\d.]+ ms / +(\d+) tokens")


@dataclass(frozen=True)
class Prefill:
    """One generate call of the engine: prompt tokens taken from its one cache slot, and evaluated anew."""

    reused: int
    evaluated: int


def engine_reuse(log: str) -> list[Prefill]:
    """The engine's generate calls, in order, from its own log: a "prefix-match hit" line (absent when nothing was
    reused) followed by the call's timing block, whose "prompt eval" line counts the tokens evaluated."""
    calls: list[Prefill] = []
    reused: int | None = None
    for line in log.splitlines():
        hit = _HIT.search(line)
        if hit:
            reused = int(hit.group(1))
            continue
        if _FULL.search(line):
            reused = -1  # the whole prompt: its size is the evaluated count the timing block reports as cached
            continue
        evaluated = _EVAL.search(line)
        if evaluated:
            n = int(evaluated.group(1))
            calls.append(Prefill(n, 0) if reused == -1 else Prefill(reused or 0, n))
            reused = None
    return calls


def reuse_ratio(calls: list[Prefill]) -> float:
    reused = sum(c.reused for c in calls)
    total = reused + sum(c.evaluated for c in calls)
    return reused / total if total else 0.0


def ceiling(prompts: list[int], epochs: list[bool]) -> tuple[float, float, int]:
    """The best hit rate a bounded prompt can reach, 1 - 2d/H: d the tokens a request adds (the mean growth of the
    prompt between two turns without an epoch), H the largest prompt. Returns (ceiling, d, H)."""
    growth = [b - a for a, b, epoch in zip(prompts, prompts[1:], epochs[1:]) if not epoch and b > a]
    d = sum(growth) / len(growth) if growth else 0.0
    h = max(prompts) if prompts else 0
    return (1 - 2 * d / h if h else 0.0), d, h
