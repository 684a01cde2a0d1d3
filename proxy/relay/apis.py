"""The two request shapes memory plugs into, and what differs between them.

The route (proxy/relay/chat.py) is the same for both: read and check the body, run the
interceptors, relay the answer byte for byte, assemble a copy for learning. Only the
body's parser, the upstream path and the answer's assembly differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.relay.exchange import Exchange, assemble_json
from proxy.relay.hooks import CHAT_API, RESPONSES_API
from proxy.relay.json_input import parse_chat_body
from proxy.relay.responses import (
    ResponsesStreamAssembler,
    assemble_response,
    parse_responses_body,
)
from proxy.relay.sse import StreamAssembler


@dataclass(frozen=True, slots=True)
class Api:
    name: str  # ChatContext.api
    upstream_path: str  # where the upstream serves it (whatever spelling the client used)
    metric: str  # the `route` label of the upstream timing metrics
    parse: Callable[[bytes], dict[str, Any]]  # raises BadJSON
    assemble_json: Callable[[Exchange, dict[str, Any]], Exchange | None]
    assembler: Callable[[Exchange], StreamAssembler]


CHAT_COMPLETIONS = Api(
    CHAT_API,
    "/v1/chat/completions",
    "chat_completions",
    parse_chat_body,
    assemble_json,
    StreamAssembler,
)
RESPONSES = Api(
    RESPONSES_API,
    "/v1/responses",
    "responses",
    parse_responses_body,
    assemble_response,
    ResponsesStreamAssembler,
)
