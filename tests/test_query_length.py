"""A recall query is embedded from its first QUERY_TOKENS word pieces, whatever its length."""

from __future__ import annotations

import numpy as np

from memory_core.embedder import QUERY_TOKENS


def long_text() -> str:
    return " ".join(f"the bees number {i} live in the garden by the wall" for i in range(80))


def test_a_long_query_is_embedded_from_its_first_word_pieces(embedder):
    text = long_text()
    bounded = embedder.bounded_query(text)
    tokenizer = embedder._load("single").model.tokenizer
    pieces = [o for o in tokenizer.encode(bounded).offsets if o != (0, 0)]
    assert len(pieces) == QUERY_TOKENS
    assert text.startswith(bounded) and len(bounded) < len(text)
    vector = embedder.embed_queries([text])[0]
    # The query session (`_run` embeds exactly what it is given) on the cut text...
    np.testing.assert_allclose(vector, embedder._run("query", [bounded])[0], atol=1e-5)
    assert not np.allclose(vector, embedder._run("query", [text])[0], atol=1e-3)
    # ...while a memory is embedded whole.
    assert not np.allclose(embedder.embed([text])[0], embedder.embed([bounded])[0], atol=1e-3)


def test_a_short_query_is_embedded_whole(embedder):
    text = "Where do I keep the bees?"
    assert embedder.bounded_query(text) == text
    np.testing.assert_allclose(
        embedder.embed_queries([text])[0], embedder._run("query", [text])[0], atol=1e-5
    )
