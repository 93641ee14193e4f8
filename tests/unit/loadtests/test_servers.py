"""The benchmarks' servers run where they are told: `overhead.py --multi-turn --baseline-tree DIR` runs a second
managed proxy from DIR's source, since `python -m` imports the package from the server's working directory."""

from __future__ import annotations

import sys

from loadtests.overhead import Server, free_port


def test_a_server_runs_in_the_working_directory_it_is_given(tmp_path) -> None:
    (tmp_path / "only-here.txt").write_text("the baseline tree")
    port = free_port()
    server = Server("tree", [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                    f"http://127.0.0.1:{port}/only-here.txt", log_dir=tmp_path, cwd=tmp_path)
    try:
        server.start(timeout=30)  # healthy only once it serves the file of that directory
    finally:
        server.stop()
