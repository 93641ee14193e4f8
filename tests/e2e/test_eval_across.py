"""The memory-across-conversations benchmark end to end on two tiny synthetic questions: a real proxy process and the
emulator, every session its own conversation, each question asked by its user and by the other one."""

from __future__ import annotations

import json

from loadtests.evals import eval_across
from tests.unit.loadtests.test_eval_across import write_s_file


def test_two_synthetic_questions_run_through_a_proxy(tmp_path, capsys) -> None:
    data = write_s_file(tmp_path / "s.json.gz")
    out = tmp_path / "across.json"
    assert eval_across.main(["--data", str(data), "--json", str(out), "--window", "4096"]) == 0
    report = capsys.readouterr().out
    assert report.startswith("$ python loadtests/evals/eval_across.py --data ")
    assert "leaks to another user: 0/2" in report
    result = json.loads(out.read_text())
    assert result["command"][:2] == ["--data", str(data)]
    tally = result["this tree"]
    assert (tally["questions"], tally["skipped"], tally["cross_asked"], tally["leaks"]) == (2, 0, 2, 0)
    assert tally["merged"] == 0  # every session, every question opened a conversation of its own
    assert tally["requests"] == 2 * (3 + 1) + 2
    assert tally["upstream_requests"] >= tally["requests"]
    assert tally["by_kind"] == {"single-session-user": {"reached": tally["reached"], "whole": tally["whole"],
                                                        "questions": 2}}
    assert len(tally["seconds"]) == 2
