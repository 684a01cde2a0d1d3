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


def test_a_forget_waits_for_every_earlier_job_of_its_tenant(jobs, run):
    """A job holding "forget my locker code" (write space work, reading personal) must not
    run while an earlier exchange's job in personal, which would store the code, still
    waits. Jobs queued after it, and other tenants' jobs, are not held back."""
    run(jobs.enqueue("acme", "personal", {"n": 0}, job_id="fact"))
    run(jobs.enqueue("acme", "personal", {"n": 1}, job_id="fact2", max_attempts=1))
    forget = run(jobs.enqueue("acme", "work", {"n": 2}, job_id="forget", forgets=True))
    assert forget.forgets is True and run(jobs.get_job("acme", "fact")).forgets is False
    run(jobs.enqueue("acme", "notes", {"n": 3}, job_id="later"))
    run(jobs.enqueue("other", "work", {"n": 0}, job_id="other", forgets=True))
    run(jobs.enqueue("acme", "work", {"n": 4}, job_id="after"))
    first = [run(jobs.claim(f"w{i}", 30)) for i in range(4)]
    assert [j.id if j else None for j in first] == ["fact", "later", "other", None]
    run(jobs.complete("fact", "w0", {}))
    assert run(jobs.claim("w4", 30)).id == "fact2"  # queued before the forget
    assert run(jobs.claim("w5", 30)) is None  # the forget waits for it while it runs
    assert run(jobs.fail("fact2", "w4", "boom", retry_in=0)).status == "dead"
    # Dead, it no longer holds the forget back; `later`, still leased, never did.
    assert run(jobs.claim("w5", 30)).id == "forget"
    assert run(jobs.claim("w6", 30)) is None  # `after` follows the forget in its scope
    run(jobs.complete("forget", "w5", {}))
    assert run(jobs.claim("w6", 30)).id == "after"


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
    assert run(jobs.release_all("w")) == 1


def test_a_process_gives_back_only_its_own_leases(jobs, run):
    """Starting (or stopping) one process never frees another's work: release_all needs
    an owner and matches only that process's workers."""
    for scope in ("s1", "s2", "s3"):
        run(jobs.enqueue("acme", scope, {}, job_id=scope))
    assert run(jobs.claim("host:1:aaaa-0", 30)).id == "s1"
    assert run(jobs.claim("host:2:bbbb-0", 30)).id == "s2"
    assert run(jobs.claim("host:1:aaaa0-0", 30)).id == "s3"  # a look-alike owner
    assert run(jobs.release_all("host:1:aaaa")) == 1
    leased = {j.id: j.lease_owner for j in run(jobs.list_jobs("acme", ["leased"]))}
    assert leased == {"s2": "host:2:bbbb-0", "s3": "host:1:aaaa0-0"}
    with pytest.raises(InvalidInput):
        run(jobs.release_all(""))


def test_a_heartbeat_keeps_the_lease_and_tells_a_lost_one(jobs, run):
    run(jobs.enqueue("acme", "default", {}, job_id="j"))
    assert run(jobs.claim("w", 0.3)).id == "j"
    assert run(jobs.extend("j", "w", 30)) is True
    time.sleep(0.4)
    assert run(jobs.claim("other", 30)) is None  # extended: still w's
    assert run(jobs.extend("j", "other", 30)) is False
    run(jobs.complete("j", "w", {}))
    assert run(jobs.extend("j", "w", 30)) is False


def test_a_draft_is_invisible_until_finished_and_can_be_dropped(jobs, run):
    draft = run(jobs.reserve("acme", "default", {"user": "u"}, "d1", 5, "h1", 0.0))
    assert draft is not None and draft.status == "pending"
    run(jobs.enqueue("acme", "default", {"user": "later"}, job_id="j2"))
    assert run(jobs.job_counts("acme"))["pending"] == 1  # the draft is not counted
    assert run(jobs.get_job("acme", "d1")) is None
    assert run(jobs.backlog()) == {"acme": 2}  # ...but it weighs on the backlog
    claimed = run(jobs.claim("w", 30))
    assert claimed.id == "j2"  # a draft never blocks the jobs after it
    run(jobs.complete("j2", "w", {}))
    assert run(jobs.finish_draft("d1", {"user": "u", "assistant": "a"})) is True
    assert run(jobs.finish_draft("d1", {})) is False
    job = run(jobs.claim("w", 30))
    assert job.id == "d1" and job.payload == {"user": "u", "assistant": "a"}
    run(jobs.reserve("acme", "default", {}, "d2", 5, None, 0.0))
    run(jobs.drop_draft("d2"))
    run(jobs.drop_draft("d1"))  # a finished job is no draft: kept
    assert run(jobs.get_job("acme", "d1")) is not None
    assert run(jobs.backlog()) == {"acme": 1}


def test_the_same_content_is_queued_once_within_the_window(jobs, run):
    assert run(jobs.reserve("acme", "s", {}, "a", 5, "same", time.time() - 60)) is not None
    assert run(jobs.reserve("acme", "s", {}, "b", 5, "same", time.time() - 60)) is None
    assert run(jobs.reserve("acme", "other", {}, "c", 5, "same", time.time() - 60)) is not None
    assert run(jobs.reserve("acme", "s", {}, "d", 5, "same", time.time() + 1)) is not None


def test_retention_prunes_done_jobs_and_stale_drafts_but_keeps_dead_ones(jobs, run):
    for job_id, space in (("done", "s1"), ("dead", "s2"), ("waiting", "s3")):
        run(jobs.enqueue("acme", space, {}, job_id=job_id, max_attempts=1))
    run(jobs.reserve("acme", "s4", {}, "draft", 5, None, 0.0))
    run(jobs.claim("w", 30))
    run(jobs.complete("done", "w", {}))
    run(jobs.claim("w", 30))
    run(jobs.fail("dead", "w", "boom", 0))
    assert run(jobs.oldest_pending_at()) is not None
    assert run(jobs.prune(time.time() - 60, time.time() - 60)) == (0, 0)
    assert run(jobs.prune(time.time() + 1, time.time() + 1)) == (1, 1)
    left = {j.id: j.status for j in run(jobs.list_jobs("acme"))}
    assert left == {"dead": "dead", "waiting": "pending"}
    with pytest.raises(InvalidInput, match="only dead"):
        run(jobs.purge("acme", "waiting"))
    with pytest.raises(NotFound):
        run(jobs.purge("other", "dead"))
    run(jobs.purge("acme", "dead"))
    assert run(jobs.get_job("acme", "dead")) is None


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
