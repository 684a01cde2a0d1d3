"""Entity tagging behind a small protocol; GLiNER2 is the optional implementation.

Install with `pip install 'memrelay[gliner]'`. The model is a Hugging Face model id or
a local directory holding a GLiNER2 checkpoint (config.json, encoder_config/,
model.safetensors, tokenizer files). Nothing is imported until first use, so the
default install needs neither gliner2 nor torch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

DEFAULT_LABELS = ("person", "organization", "location", "product", "event")


class EntityExtractor(Protocol):
    def entities(self, text: str) -> list[str]:
        """Entities found in `text`, as `label:text` strings."""
        ...


class EntityModelUnavailable(RuntimeError):
    """gliner2 is not installed, or the model cannot be found or loaded."""


class GLiNER2Entities:
    """Zero-shot entity tagging with a GLiNER2 checkpoint, loaded once, thread-safe."""

    def __init__(
        self,
        model: str,
        labels: tuple[str, ...] | list[str] = DEFAULT_LABELS,
        threshold: float = 0.5,
    ) -> None:
        self.model_ref = model
        self.labels = list(labels)
        self.threshold = threshold
        self._model: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from gliner2 import GLiNER2
                except ImportError as exc:
                    raise EntityModelUnavailable(
                        "entity tagging needs the gliner extra: pip install 'memrelay[gliner]'"
                    ) from exc
                looks_local = (
                    self.model_ref.startswith((".", "/", "~")) or Path(self.model_ref).exists()
                )
                path = Path(self.model_ref).expanduser()
                if looks_local and not (path / "config.json").is_file():
                    raise EntityModelUnavailable(f"no GLiNER2 checkpoint (config.json) in {path}")
                try:
                    self._model = GLiNER2.from_pretrained(
                        str(path) if looks_local else self.model_ref
                    )
                except Exception as exc:  # a hub id without network, a broken checkpoint
                    raise EntityModelUnavailable(
                        f"could not load GLiNER2 model {self.model_ref!r}: {exc}"
                    ) from exc
            return self._model

    def entities(self, text: str) -> list[str]:
        model = self.load()
        result = model.extract_entities(text, self.labels, threshold=self.threshold)
        found: list[str] = []
        for label, items in (result.get("entities") or {}).items():
            for item in items:
                value = item.get("text") if isinstance(item, dict) else item
                if isinstance(value, str) and value.strip():
                    tag = f"{label}:{' '.join(value.split())}"
                    if tag not in found:
                        found.append(tag)
        return found
