"""The parts of one user turn shown beside a search hit: the part before a continuation page, the part after when
the match sits in the hit's last message."""

from __future__ import annotations

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ACTIVE, ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.reading.neighbours import part_after, part_before
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.tool.schema import RecallArgs

MESSAGES = [
    {"role": "user", "content": "Lunch ideas near the office?"},                            # page 1
    {"role": "assistant", "content": "Try the noodle bar."},
    {"role": "user", "content": "Deploy the billing service to staging."},                   # page 2
    {"role": "assistant", "content": "Deploying now."},
    {"role": "tool", "content": "build passed"},                                             # page 2.2
    {"role": "assistant", "content": "The rollout failed with error E7349 in the logs."},
    {"role": "assistant", "content": "E7349 means the memory limit: raised it to 2 GB, rollout done."},  # page 2.3
    {"role": "user", "content": "Thanks!"},                                                  # page 3 (active)
    {"role": "assistant", "content": "You're welcome."},
]


def _state(third_part_status: int = ARCHIVED) -> ConversationState:
    def page(number: int, part: int, start: int, end: int, status: int = ARCHIVED) -> PageRecord:
        return PageRecord(number=number, part=part, start=start, end=end, tokens=10, status=status)

    return ConversationState(pages=[page(1, 1, 0, 2), page(2, 1, 2, 4), page(2, 2, 4, 6),
                                    page(2, 3, 6, 7, third_part_status), page(3, 1, 7, 9, ACTIVE)])


def test_parts_of_one_turn() -> None:
    state = _state()
    assert part_before(state, "2.2") == "2" and part_before(state, "2.3") == "2.2"
    assert part_before(state, "2") is None and part_before(state, "1") is None
    assert part_after(state, "2") == "2.2" and part_after(state, "2.2") == "2.3"
    assert part_after(state, "2.3") is None and part_after(state, "1") is None and part_after(state, "9") is None
    assert part_after(_state(ACTIVE), "2.2") is None  # in the prompt already


async def test_a_hit_on_a_continuation_brings_the_question_and_the_answer() -> None:
    resolver = RecallResolver(None, EstimateCounter(), 2048)
    ctx = RecallContext("t1", "c1", _state(), MESSAGES)
    assert [label for label, _ in await resolver.search(ctx, "error logs", 5)] == ["2.2"]
    lines = (await resolver.resolve(ctx, RecallArgs(query="error logs"))).text.splitlines()
    assert lines[1].startswith("[Page 2.2] 1970-01-01, score")
    assert lines[2] == ("[Page 2] 1970-01-01, the same turn as page 2.2: user: Deploy the billing service to "
                        "staging. assistant: Deploying now.")
    assert lines[3].startswith("[Page 2.3] 1970-01-01, the same turn as page 2.2: assistant: E7349")  # the match
    assert len(lines) == 4  # sits in the last message of 2.2: the part after it too


async def test_no_neighbour_for_a_whole_page_or_a_match_away_from_the_end() -> None:
    resolver = RecallResolver(None, EstimateCounter(), 2048)
    ctx = RecallContext("t1", "c1", _state(), MESSAGES)
    text = (await resolver.resolve(ctx, RecallArgs(query="noodle lunch"))).text
    assert "[Page 1]" in text and "the same turn" not in text
    text = (await resolver.resolve(ctx, RecallArgs(query="billing staging"))).text
    assert "[Page 2] " in text and "[Page 2.2]" not in text  # the match is in the user's message, not the last one
