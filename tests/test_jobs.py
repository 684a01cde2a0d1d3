"""The extraction queue on a real SQLite file: ordering, leases, dead letters, idempotency."""

from __future__ import annotations

import time

import pytest

from memory_core import InvalidInput, NotFound
from memory_core.backends import jobs_for


@pytest.fixture
def jobs(store):
    return jobs_for(store)


def test_enqueue_is_idempotent_by_id(jobs, run):
    first = run(jobs.enqueue("acme", "default", {"user": "a"}, job_id="job_1"))
    again = run(jobs.enqueue("acme", "default", {"user": "b"}, job_id="job_1"))
    assert again.id == first.id and again.payload == {"user": "a"}
    assert run(jobs.job_counts("acme"))["pending"] == 1


def test_one_scope_is_claimed_in_order_and_one_at_a_time(jobs, run):
    for i in range(3):
        run(jobs.enqueue("acme", "s1", {"n": i}, job_id=f"a{i}"))
    run(jobs.enqueue("acme", "s2", {"n": 0}, job_id="b0"))
    run(jobs.enqueue("other", "s1", {"n": 0}, job_id="c0"))
    claimed = [run(jobs.claim(f"w{i}", 30)) for i in range(5)]
    ids = [j.id if j else None for j in claimed]
    assert ids == ["a0", "b0", "c0", None, None]  # a1 waits for a0
    run(jobs.complete("a0", "w0", {"ok": True}))
    assert run(jobs.claim("w5", 30)).id == "a1"
    done = run(jobs.get_job("acme", "a0"))
    assert done.status == "done" and done.payload is None and done.result == {"ok": True}


def test_expired_lease_is_claimed_again(jobs, run):
    run(jobs.enqueue("acme", "default", {}, job_id="j"))
    assert run(jobs.claim("dead-worker", 0.1)).id == "j"
    assert run(jobs.claim("other", 30)) is None
    time.sleep(0.15)
    again = run(jobs.claim("other", 30))
    assert again.id == "j" and again.attempts == 2 and again.lease_owner == "other"
    with pytest.raises(InvalidInput, match="lease lost"):
        run(jobs.complete("j", "dead-worker", {}))


def test_failures_retry_then_dead_letter_then_manual_retry(jobs, run):
    run(jobs.enqueue("acme", "default", {"user": "x"}, job_id="j", max_attempts=2))
    run(jobs.claim("w", 30))
    failed = run(jobs.fail("j", "w", "boom 1", retry_in=0.0))
    assert failed.status == "pending" and failed.last_error == "boom 1"
    run(jobs.claim("w", 30))
    dead = run(jobs.fail("j", "w", "boom 2", retry_in=0.0))
    assert dead.status == "dead" and dead.payload == {"user": "x"}
    assert run(jobs.claim("w", 30)) is None
    with pytest.raises(NotFound):
        run(jobs.retry("other-tenant", "j"))
    retried = run(jobs.retry("acme", "j"))
    assert retried.status == "pending" and retried.attempts == 0
    with pytest.raises(InvalidInput, match="only dead"):
        run(jobs.retry("acme", "j"))


def test_backoff_delays_the_next_claim(jobs, run):
    run(jobs.enqueue("acme", "default", {}, job_id="j"))
    run(jobs.claim("w", 30))
    run(jobs.fail("j", "w", "later", retry_in=60))
    assert run(jobs.claim("w", 30)) is None


def test_release_gives_the_attempt_back(jobs, run):
    run(jobs.enqueue("acme", "default", {}, job_id="j"))
    run(jobs.claim("w", 30))
    run(jobs.release("j", "w"))
    job = run(jobs.get_job("acme", "j"))
    assert job.status == "pending" and job.attempts == 0
    run(jobs.claim("w", 30))
    assert run(jobs.release_all()) == 1


def test_listing_is_scoped_by_tenant(jobs, run):
    run(jobs.enqueue("acme", "default", {}, job_id="a"))
    run(jobs.enqueue("other", "default", {}, job_id="b"))
    assert [j.id for j in run(jobs.list_jobs("acme"))] == ["a"]
    assert run(jobs.get_job("acme", "b")) is None
    with pytest.raises(InvalidInput):
        run(jobs.list_jobs("acme", ["weird"]))


def test_two_stores_sharing_one_queue_keep_scope_order_and_exclusivity(store, run, other_store):
    """As two replicas would: claimers on two stores of one database never hold two jobs
    of a scope at once, and finish each scope's jobs in the order they were enqueued."""
    import asyncio

    queues = [jobs_for(store), jobs_for(other_store(same=True))]
    scopes = ["s0", "s1", "s2"]
    for n in range(30):
        run(queues[0].enqueue("acme", scopes[n % 3], {"n": n}, job_id=f"job{n:02d}"))
    in_flight: set[str] = set()
    overlaps: list[str] = []
    finished: dict[str, list[int]] = {space: [] for space in scopes}

    async def claimer(name: str, queue) -> None:
        idle = 0
        while idle < 20:
            job = await queue.claim(name, 30)
            if job is None:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            if job.space in in_flight:
                overlaps.append(job.id)
            in_flight.add(job.space)
            await asyncio.sleep(0.002)
            finished[job.space].append(job.payload["n"])
            in_flight.discard(job.space)
            await queue.complete(job.id, name, {})

    async def main() -> None:
        await asyncio.gather(*(claimer(f"w{i}", queues[i % 2]) for i in range(6)))

    run(main())
    assert overlaps == []
    for space, numbers in finished.items():
        assert numbers == sorted(numbers) and len(numbers) == 10, space
    assert run(queues[1].job_counts("acme"))["done"] == 30
