"""Rendezvous hashing stability, down-marking with a cool-down on an injected clock."""

from memci_proxy.turn.identity import pass_through_route_key
from memci_proxy.upstream.routing import WorkerRouter, rendezvous_order
from tests.manual_clock import ManualClock

WORKERS = [f"http://10.0.0.{i}:30000/v1" for i in range(1, 5)]


def test_rendezvous_is_deterministic_and_spreads_keys():
    keys = [f"conv-{i}" for i in range(4000)]
    owners = [rendezvous_order(k, WORKERS)[0] for k in keys]
    assert owners == [rendezvous_order(k, list(reversed(WORKERS)))[0] for k in keys]
    counts = {w: owners.count(w) for w in WORKERS}
    assert all(700 < c < 1300 for c in counts.values()), counts


def test_adding_a_worker_moves_about_one_in_n_keys_all_to_the_new_worker():
    keys = [f"conv-{i}" for i in range(5000)]
    five = WORKERS + ["http://10.0.0.5:30000/v1"]
    before = {k: rendezvous_order(k, WORKERS)[0] for k in keys}
    after = {k: rendezvous_order(k, five)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == five[-1] for k in moved)
    assert 0.15 < len(moved) / len(keys) < 0.25  # ~1/5


def test_removing_a_worker_moves_only_its_keys():
    keys = [f"conv-{i}" for i in range(2000)]
    three = WORKERS[:3]
    for k in keys:
        before = rendezvous_order(k, WORKERS)[0]
        if before != WORKERS[3]:
            assert rendezvous_order(k, three)[0] == before


def test_a_connection_failure_skips_the_worker_until_the_cool_down_ends():
    clock = ManualClock()
    router = WorkerRouter(WORKERS, down_after=3, down_seconds=10, clock=clock)
    key = "conv-7"
    first, second = router.candidates(key)[:2]
    router.record(first, "connect_error")
    assert router.candidates(key)[0] == second and router.candidates(key)[-1] == first
    clock.now = 9.9
    assert router.candidates(key)[0] == second
    clock.now = 10.1
    assert router.candidates(key)[0] == first  # tried again after the cool-down
    router.record(first, "ok")
    assert router.health.down_count() == 0


def test_a_burst_of_server_errors_marks_down_and_a_success_resets():
    clock = ManualClock()
    router = WorkerRouter(WORKERS, down_after=3, down_seconds=10, clock=clock)
    w = WORKERS[0]
    router.record(w, "server_error")
    router.record(w, "server_error")
    router.record(w, "ok")
    router.record(w, "server_error")
    router.record(w, "server_error")
    assert not router.health.is_down(w)
    router.record(w, "server_error")
    assert router.health.is_down(w)


def test_every_worker_down_still_gives_every_worker_in_rank_order():
    router = WorkerRouter(WORKERS, down_after=1, down_seconds=10, clock=ManualClock())
    for w in WORKERS:
        router.record(w, "connect_error")
    assert router.candidates("k") == rendezvous_order("k", WORKERS)


def test_pass_through_key_sticks_across_turns_and_differs_by_tenant():
    turn1 = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]}
    assert pass_through_route_key("t1", {}, turn1) == pass_through_route_key("t1", {}, turn2)
    assert pass_through_route_key("t1", {}, turn1) != pass_through_route_key("t2", {}, turn1)
    assert pass_through_route_key("t1", {"x-session-id": "s1"}, turn1) == pass_through_route_key(
        "t1", {"x-session-id": "s1"}, {"messages": [{"role": "user", "content": "other"}]})
