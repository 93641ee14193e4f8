from memci_proxy.engine import ARCHIVED, EVICTED, PageRecord
from memci_proxy.engine.eviction import lru_evictions, lru_order, rule_evictions


def page(n: int, archived_turn: int, recalls: int = 0, last_recalled: int = -1, status: int = ARCHIVED,
         contents_tokens: int = 10) -> PageRecord:
    return PageRecord(n, 1, n, n + 1, 10, status=status, archived_turn=archived_turn, recall_count=recalls,
                      last_recalled_turn=last_recalled, contents_tokens=contents_tokens)


def test_rule_m_evicts_entries_never_recalled_after_m_rounds() -> None:
    pages = [page(1, archived_turn=0), page(2, archived_turn=5), page(3, archived_turn=0, recalls=1, last_recalled=9)]
    assert rule_evictions(pages, turn=10, unrecalled_after=10, unchanged_after=100) == [(0, "unrecalled")]
    assert rule_evictions(pages, turn=9, unrecalled_after=10, unchanged_after=100) == []


def test_rule_p_evicts_entries_whose_recall_count_is_unchanged_for_p_rounds() -> None:
    pages = [page(1, archived_turn=0, recalls=3, last_recalled=10), page(2, archived_turn=0, recalls=1, last_recalled=2)]
    assert rule_evictions(pages, turn=22, unrecalled_after=5, unchanged_after=20) == [(1, "unchanged")]
    assert rule_evictions(pages, turn=30, unrecalled_after=5, unchanged_after=20) == [(0, "unchanged"), (1, "unchanged")]


def test_evicted_and_active_pages_are_left_alone() -> None:
    pages = [page(1, 0, status=EVICTED), page(2, -1, status=0)]
    assert rule_evictions(pages, turn=1000, unrecalled_after=1, unchanged_after=1) == []
    assert lru_order(pages) == []


def test_lru_evicts_least_recently_used_until_the_contents_page_fits() -> None:
    pages = [page(1, archived_turn=1, recalls=1, last_recalled=50), page(2, archived_turn=2),
             page(3, archived_turn=3), page(4, archived_turn=40)]
    assert lru_order(pages) == [1, 2, 3, 0]
    # 4 entries of 10 tokens + a 5-token header = 45; must get to 30
    assert lru_evictions(pages, contents_tokens=45, header_tokens=5, max_tokens=30) == [1, 2]
    assert lru_evictions(pages, contents_tokens=45, header_tokens=5, max_tokens=45) == []
