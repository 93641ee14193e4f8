"""SGLang itself (RadixAttention) for end-to-end tests and benchmarks: SmolLM2-135M-Instruct on the CPU, built by the
shared tool `../shared/tools/real-sglang.sh` (relative to the repository root; `MEMCI_REAL_SGLANG_SCRIPT` names
another copy) and cached in `~/.cache/memci-real-sglang` (`MEMCI_REAL_SGLANG_DIR`) between runs.

What it gives that the emulator and the one-slot llama.cpp server cannot: the engine the proxy's layout is designed
for, a real radix tree that keeps many prefixes at once, its own count of reused tokens per request
(`usage.prompt_tokens_details.cached_tokens`) and per prefill batch (its log: "#new-token: N, #cached-token: M", read
by `prefill_batches`), its `/tokenize`, and its refusals past the context.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.e2e.proxyproc import REPO, LoggedServer, free_port
from tests.e2e.real_engine import Prefill, build

MODEL = "smollm2"


def build_script() -> Path | None:
    """The build script (None: not there, as in a clone without the shared tools beside it)."""
    named = os.environ.get("MEMCI_REAL_SGLANG_SCRIPT")
    script = Path(named) if named else REPO.parent / "shared" / "tools" / "real-sglang.sh"
    return script if script.is_file() else None


def build_or_skip() -> tuple[Path, Path]:
    """(script, directory) of a built SGLang; skips the calling test when the script is absent or the CPU cannot run
    its compiled operators (they need AVX-512 with bf16)."""
    import pytest

    script = build_script()
    if script is None:
        pytest.skip("SGLang's build script (../shared/tools/real-sglang.sh) is not there")
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        pytest.skip("this CPU has neither avx512_bf16 nor AMX: SGLang's CPU operators cannot run")
    return script, build(script)


class SGLangServer(LoggedServer):
    """`sglang serve` as a process (through the script's `serve`, which holds the flags this CPU needs); its log
    (stdout and stderr) in `log_path`."""

    def __init__(self, script: Path, directory: Path, log_path: Path, context: int = 4096,
                 extra: tuple[str, ...] = ()) -> None:
        self.script = script
        self.directory = directory
        self.log_path = log_path
        self.context = context
        self.extra = extra
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240.0) -> "SGLangServer":
        # One compute thread: on two cores shared with the proxy and the test, a second OpenMP thread waiting at
        # every barrier for a descheduled sibling made decoding 5-10x slower, not faster.
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("MEMCI_SGLANG_THREADS", "1")}
        self.spawn(["bash", str(self.script), str(self.directory), "serve", str(self.port),
                    "--context-length", str(self.context), *self.extra], self.url + "/v1/models", timeout, "SGLang",
                   env=env)
        return self


_BATCH = re.compile(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+)")


def prefill_batches(log: str) -> list[Prefill]:
    """SGLang's prefill batches, in order, from its own log: prompt tokens found in the radix tree (reused), and
    computed anew (evaluated); `reuse_ratio` gives their token-weighted share."""
    return [Prefill(int(m.group(2)), int(m.group(1))) for m in _BATCH.finditer(log)]
