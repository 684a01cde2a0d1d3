"""Recalled memories as text a model will obey, and the scrubbing of their echoes.

Memories become at most two marked blocks: constraints (rules, and mistakes to avoid)
and context (background facts). Each memory is one sanitised line, so no memory can
open a new instruction, close a block early, or blow the character budget. Text is NFKC
normalised first, so full-width or other look-alike brackets are matched as the markers
they imitate, and chat-template special tokens (`<|im_start|>`, `</s>`, `[INST]`, ...)
are removed, so a memory cannot end the system turn and open a new one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from memory_core.model import Memory

CONSTRAINTS_OPEN, CONSTRAINTS_CLOSE = "[memrelay:constraints]", "[/memrelay:constraints]"
CONTEXT_OPEN, CONTEXT_CLOSE = "[memrelay:context]", "[/memrelay:context]"
# Any `memrelay:` inside a memory is defused, whatever bracket (or look-alike) precedes it.
_MARKER = re.compile(r"(\[\s*/?\s*)?memrelay\s*:", re.IGNORECASE)
# Chat-template control tokens of the common families (ChatML, Llama 2/3, Gemma, Mistral,
# DeepSeek after NFKC, Phi, tool and thinking tags), case-insensitive.
_SPECIAL = re.compile(
    r"<\|[^<>|\n]{0,64}\|>"  # <|im_start|> <|eot_id|> <|start_header_id|> <|endoftext|>
    r"|</?\s*s\s*>"  # <s> </s>
    r"|\[\s*/?\s*(?:INST|SYS|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS|SYSTEM_PROMPT)\s*\]"
    r"|<<\s*/?\s*SYS\s*>>"
    r"|<\s*/?\s*(?:start_of_turn|end_of_turn|bos|eos|pad|unk|eot|tool_call|tool_response"
    r"|think|begin_of_text|end_of_text|\|?(?:begin|end)[_▁]of[_▁]sentence\|?)\s*>",
    re.IGNORECASE,
)
_BLOCK = re.compile(
    r"\[memrelay:(constraints|context)\].*?(\[/memrelay:\1\]|\Z)", re.DOTALL | re.IGNORECASE
)


@dataclass
class Injection:
    """The text to add to the system message and the memories it carries."""

    text: str
    memory_ids: list[str]


# ASCII's control characters (its only category-C ones) but tab and line ends.
_ASCII_CONTROLS = dict.fromkeys([*range(0x20), 0x7F])
for _kept in "\t\n\r":
    del _ASCII_CONTROLS[ord(_kept)]


def sanitise(text: str, max_chars: int) -> str:
    """One line: NFKC normalised, chat-template tokens removed, control and format
    characters dropped, whitespace collapsed, markers defused, length capped."""
    if text.isascii():  # NFKC leaves ASCII as it is; one C-level pass (every recall)
        text = text.translate(_ASCII_CONTROLS)
    else:
        text = unicodedata.normalize("NFKC", text)
        kept = []
        for ch in text:
            category = unicodedata.category(ch)
            if category.startswith("C") and ch not in "\t\n\r":
                continue
            kept.append(ch)
        text = "".join(kept)
    for _ in range(8):  # removing one token must not assemble another
        cleaned = _SPECIAL.sub(" ", text)
        if cleaned == text:
            break
        text = cleaned
    line = " ".join(text.split())
    line = _MARKER.sub(lambda m: m.group(0).replace("[", "(").replace(":", " "), line)
    if len(line) > max_chars:
        line = line[: max(0, max_chars - 1)].rstrip() + "…"
    return line


def qualifier(confidence: float) -> str:
    if confidence >= 0.85:
        return "confident"
    if confidence >= 0.6:
        return "likely"
    return "uncertain"


def render(memories: Sequence[Memory], budget_chars: int, memory_max_chars: int) -> Injection:
    """Blocks for memories given most relevant first; lines past the budget are left out."""
    rules: list[str] = []
    avoid: list[str] = []
    facts: list[str] = []
    used = 0
    ids: list[str] = []
    for memory in memories:
        if not memory.content:
            continue
        line = f"- {sanitise(memory.content, memory_max_chars)} ({qualifier(memory.confidence)})"
        if used + len(line) + 1 > budget_chars:
            continue
        used += len(line) + 1
        ids.append(memory.id)
        {"critical": rules, "antipattern": avoid}.get(memory.severity, facts).append(line)
    blocks = []
    if rules or avoid:
        lines = [CONSTRAINTS_OPEN]
        if rules:
            lines += ["Rules remembered from earlier conversations. Follow them:", *rules]
        if avoid:
            lines += ["Mistakes made before. Do not repeat them:", *avoid]
        blocks.append("\n".join([*lines, CONSTRAINTS_CLOSE]))
    if facts:
        lines = [CONTEXT_OPEN, "Background facts remembered from earlier conversations:", *facts]
        blocks.append("\n".join([*lines, CONTEXT_CLOSE]))
    return Injection("\n\n".join(blocks), ids)


def scrub(text: str) -> str:
    """Remove injected blocks (and unterminated ones) that a reply echoes back."""
    return _BLOCK.sub("", text).strip()
