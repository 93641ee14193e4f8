"""Radix tree (compressed trie) of token ids with LRU eviction of leaves, like SGLang's RadixAttention cache.

``match_prefix`` gives the length of the longest cached prefix of a token sequence; ``insert`` adds a
sequence. When the tree holds more tokens than its capacity, least recently used leaves are evicted until
it fits. Access times come from a counter, so the behaviour is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("key", "children", "parent", "last_access")

    def __init__(self, key: list[int], parent: _Node | None, last_access: int) -> None:
        self.key = key
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_access = last_access


def _common_length(key: list[int], tokens: Sequence[int], start: int) -> int:
    """How many leading tokens of ``key`` equal ``tokens[start:]``."""
    length = min(len(key), len(tokens) - start)
    if key[:length] == tokens[start : start + length]:
        return length
    index = 0
    while index < length and key[index] == tokens[start + index]:
        index += 1
    return index


class RadixCache:
    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0")
        self.capacity_tokens = capacity_tokens
        self.reset()

    def reset(self) -> None:
        self._root = _Node([], None, 0)
        self._clock = 0
        self._total_tokens = 0
        self._node_count = 0
        self._evicted_tokens = 0
        # Lazy heap of (last_access, tie, node) for leaves; stale entries are skipped when popped.
        self._leaf_heap: list[tuple[int, int, _Node]] = []
        self._tie = 0

    @property
    def total_tokens(self) -> int:
        return self._total_tokens

    @property
    def node_count(self) -> int:
        return self._node_count

    @property
    def evicted_tokens(self) -> int:
        return self._evicted_tokens

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _push_leaf(self, node: _Node) -> None:
        self._tie += 1
        heapq.heappush(self._leaf_heap, (node.last_access, self._tie, node))

    def match_prefix(self, tokens: Sequence[int], touch: bool = True) -> int:
        """Length of the longest prefix of ``tokens`` held in the tree; marks the matched path as used."""
        now = self._tick() if touch else 0
        node = self._root
        position = 0
        total = len(tokens)
        while position < total:
            child = node.children.get(tokens[position])
            if child is None:
                break
            matched = _common_length(child.key, tokens, position)
            position += matched
            if touch:
                child.last_access = now
            node = child
            if matched < len(child.key):
                break
        if touch and node is not self._root and not node.children:
            self._push_leaf(node)
        return position

    def insert(self, tokens: Sequence[int]) -> int:
        """Add ``tokens``; returns how many of them were already cached. Evicts to stay under capacity."""
        now = self._tick()
        node = self._root
        position = 0
        total = len(tokens)
        while position < total:
            child = node.children.get(tokens[position])
            if child is None:
                leaf = _Node(list(tokens[position:]), node, now)
                node.children[tokens[position]] = leaf
                self._node_count += 1
                self._total_tokens += total - position
                self._push_leaf(leaf)
                already_cached = position
                break
            matched = _common_length(child.key, tokens, position)
            if matched < len(child.key):
                child = self._split(child, matched)
            child.last_access = now
            position += matched
            node = child
        else:
            already_cached = total
            if node is not self._root and not node.children:
                self._push_leaf(node)
        if self._total_tokens > self.capacity_tokens:
            self._evict(self._total_tokens - self.capacity_tokens)
        elif len(self._leaf_heap) > 4 * self._node_count + 1024:
            self._rebuild_heap()  # drop stale entries so the heap stays proportional to the tree
        return already_cached

    def _split(self, child: _Node, at: int) -> _Node:
        """Split ``child`` so that its first ``at`` tokens become a new parent node; returns that parent."""
        parent = child.parent
        assert parent is not None
        middle = _Node(child.key[:at], parent, child.last_access)
        parent.children[child.key[0]] = middle
        child.key = child.key[at:]
        child.parent = middle
        middle.children[child.key[0]] = child
        self._node_count += 1
        return middle

    def _evict(self, tokens_to_free: int) -> None:
        freed = 0
        heap = self._leaf_heap
        if len(heap) > 4 * self._node_count + 1024:
            self._rebuild_heap()
            heap = self._leaf_heap
        while freed < tokens_to_free:
            if not heap:
                self._rebuild_heap()
                heap = self._leaf_heap
                if not heap:
                    break
            last_access, _, node = heapq.heappop(heap)
            parent = node.parent
            if parent is None or node.children or node.last_access != last_access:
                continue  # stale entry: evicted already, no longer a leaf, or used since
            del parent.children[node.key[0]]
            node.parent = None
            freed += len(node.key)
            self._node_count -= 1
            if parent is not self._root and not parent.children:
                self._push_leaf(parent)
        self._total_tokens -= freed
        self._evicted_tokens += freed

    def _rebuild_heap(self) -> None:
        self._leaf_heap = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                self._tie += 1
                self._leaf_heap.append((node.last_access, self._tie, node))
        heapq.heapify(self._leaf_heap)

    def sequences_token_count(self) -> int:
        """Tokens held, recounted by walking the tree (for checks)."""
        count = 0
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            count += len(node.key)
            stack.extend(node.children.values())
        return count
