"""The id-blanking used by the tests that look for a user's words in what memrelay shows."""

from __future__ import annotations

from tests.text_checks import without_generated_ids


def test_generated_ids_are_blanked_and_words_are_kept():
    page = (
        '<a href="/memrelay/ui/memories/mem_01a232eae7bc97175883eebf4711">Bulk memory</a>'
        " job_34c58615808048fe4711aa event 992c80807043aa4711bb0123456789ab"
    )
    assert "4711" not in without_generated_ids(page + " at 1796143499.9047118")
    assert "4711" in without_generated_ids(page + " bob's vault code is 4711")
    assert "4711" in without_generated_ids("mem-4711 and job 4711")  # not generated ids
