from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.emulator.radix import RadixCache

sequences = st.lists(st.lists(st.integers(min_value=0, max_value=3), max_size=12), max_size=25)


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


@given(inserted=sequences, query=st.lists(st.integers(min_value=0, max_value=3), max_size=14))
def test_match_equals_brute_force_longest_common_prefix(inserted: list[list[int]], query: list[int]) -> None:
    cache = RadixCache(capacity_tokens=10**9)
    for sequence in inserted:
        cache.insert(sequence)
    expected = max((longest_common_prefix(query, sequence) for sequence in inserted), default=0)
    assert cache.match_prefix(query) == expected


@given(inserted=sequences)
def test_token_count_is_the_size_of_the_trie(inserted: list[list[int]]) -> None:
    cache = RadixCache(capacity_tokens=10**9)
    for sequence in inserted:
        cache.insert(sequence)
    prefixes = {tuple(sequence[:end]) for sequence in inserted for end in range(1, len(sequence) + 1)}
    assert cache.total_tokens == len(prefixes) == cache.sequences_token_count()


@settings(max_examples=200)
@given(inserted=sequences, capacity=st.integers(min_value=0, max_value=30))
def test_eviction_keeps_total_under_capacity(inserted: list[list[int]], capacity: int) -> None:
    cache = RadixCache(capacity_tokens=capacity)
    for sequence in inserted:
        cache.insert(sequence)
        assert cache.total_tokens <= capacity
        assert cache.total_tokens == cache.sequences_token_count()
        for other in inserted:
            assert cache.match_prefix(other, touch=False) <= len(other)


def test_least_recently_used_leaf_goes_first() -> None:
    cache = RadixCache(capacity_tokens=12)
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    cache.insert([9, 10, 11, 12])
    assert cache.match_prefix([1, 2, 3, 4]) == 4  # [1..4] is now the most recently used
    cache.insert([13, 14, 15, 16])  # needs 4 tokens: [5..8] is the least recently used
    assert cache.match_prefix([5, 6, 7, 8], touch=False) == 0
    assert cache.match_prefix([1, 2, 3, 4], touch=False) == 4
    assert cache.match_prefix([9, 10, 11, 12], touch=False) == 4
    assert cache.match_prefix([13, 14, 15, 16], touch=False) == 4


def test_eviction_frees_leaves_before_their_shared_prefix() -> None:
    cache = RadixCache(capacity_tokens=10)
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.insert([1, 2, 3, 7, 8])  # shares [1, 2, 3]: 8 tokens held
    cache.insert([9, 9, 9])  # 11 > 10: the oldest leaf [4, 5, 6] goes
    assert cache.total_tokens == 8
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], touch=False) == 3
    assert cache.match_prefix([1, 2, 3, 7, 8], touch=False) == 5


def test_insert_reports_tokens_already_cached_and_reset_empties() -> None:
    cache = RadixCache(capacity_tokens=100)
    assert cache.insert([1, 2, 3]) == 0
    assert cache.insert([1, 2, 3, 4]) == 3
    assert cache.insert([1, 2]) == 2
    cache.reset()
    assert cache.total_tokens == 0
    assert cache.match_prefix([1, 2, 3]) == 0


def test_many_inserts_keep_the_lazy_heap_bounded() -> None:
    cache = RadixCache(capacity_tokens=10**9)
    for _ in range(5000):
        cache.insert([1, 2, 3])
        cache.match_prefix([1, 2, 3])
    assert len(cache._leaf_heap) <= 4 * cache.node_count + 1024 + 2
