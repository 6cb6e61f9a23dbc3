"""`Backoff`: capped exponential growth, equal jitter, no overflow however long it retries."""

from __future__ import annotations

from bridge.routing.retry import Backoff


def ceilings(backoff: Backoff, count: int) -> list[float]:
    """The first `count` ceilings: `initial * multiplier**n`, capped at `maximum`."""
    return [min(backoff.maximum, backoff.initial * backoff.multiplier**n) for n in range(count)]


def test_delays_grow_with_each_failure_in_a_row() -> None:
    backoff = Backoff(initial=0.1, maximum=30.0, multiplier=2.0)
    delays = [backoff.next_delay() for _ in range(9)]
    # equal jitter: the least of a delay (ceiling / 2) is the most of the one before it
    assert delays == sorted(delays)
    assert delays[-1] >= 0.1 * 2**8 / 2


def test_delays_stay_in_the_equal_jitter_range_of_their_ceiling() -> None:
    for _ in range(200):
        backoff = Backoff(initial=0.1, maximum=30.0, multiplier=2.0)
        for ceiling in ceilings(backoff, 12):
            delay = backoff.next_delay()
            assert ceiling / 2 <= delay <= ceiling


def test_delays_stop_growing_at_the_maximum() -> None:
    backoff = Backoff(initial=0.1, maximum=30.0, multiplier=2.0)
    for _ in range(9):  # 0.1 * 2**9 = 51.2: past the maximum from the tenth delay on
        backoff.next_delay()
    later = [backoff.next_delay() for _ in range(1000)]
    assert all(15.0 <= delay <= 30.0 for delay in later)
    assert max(later) > 29.0 and min(later) < 16.0  # jittered over the whole range


def test_a_hundred_thousand_failures_in_a_row_do_not_overflow() -> None:
    backoff = Backoff(initial=0.1, maximum=30.0, multiplier=2.0)
    for _ in range(100_000):
        delay = backoff.next_delay()
    assert 15.0 <= delay <= 30.0
    assert backoff.attempts == 100_000

    huge = Backoff(initial=1.0, maximum=60.0, multiplier=1e308)  # inf from the third step
    assert [huge.next_delay() <= 60.0 for _ in range(5)] == [True] * 5


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(initial=0.1, maximum=30.0, multiplier=2.0)
    for _ in range(50):
        backoff.next_delay()
    backoff.reset()
    assert backoff.attempts == 0
    assert 0.05 <= backoff.next_delay() <= 0.1
    assert 0.1 <= backoff.next_delay() <= 0.2
