"""Explicit memory requests, recognised without a model.

Whatever the extraction model (even one that extracts nothing), a user who says
"remember that ..." or "forget ..." is obeyed: the request becomes a fact or a forget
request that goes through the same reconciliation as extracted ones.

The grammar, one sentence at a time (a message may hold several), case-insensitive,
after an optional politeness prefix ("please", "can you", "could you", "bitte",
"por favor", "s'il te plaît", ...):

  remember   EN  remember (that|:) X | please remember X | please note (that|:)? X
                 | note (that|:) X | keep in mind (that)? X | make a note (that|:)? X
                 | don't forget (that|:) X | for the record[,:] X
             DE  merk dir[,:]? (dass)? X | bitte merken: X | notiere[,:]? (dass)? X
             FR  souviens-toi que X | rappelle-toi que X | retiens que X | note que X
             ES  recuerda que X | acuérdate de que X | toma nota de que X | anota que X
             PT  lembra que X | lembre-se (de) que X | anota que X | anote que X
  forget     EN  forget (about)? (that|what I said about|everything about)? X
                 where X starts with my / that / I / what / the (so "don't forget to
                 buy milk" and "I forgot my keys" are not requests)
             DE  vergiss (bitte)? (dass)? X
             FR  oublie (que)? X
             ES  olvida (que)? X | olvídate de X
             PT  esquece (que)? X | esqueça (que)? X

A question ("remember when we met?") is not a request, unless it asks for one ("can you
forget my address?"). X is kept as said; English
first-person statements are rewritten in the third person ("I live in Munich" becomes
"The user lives in Munich"); other languages keep the user's words, prefixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_POLITE = (
    r"(?:(?:please|pls|hey|ok(?:ay)?|so|and|also|oh|can you|could you|would you|will you"
    r"|bitte|kannst du|por favor|puedes|pode|podes|s'il te pla[iî]t|s'il vous pla[iî]t)[\s,]+)*"
)
REMEMBER_PATTERNS = [
    ("en", r"remember(?:\s+that\b|\s*:)\s*(?P<x>.+)"),
    ("en", r"remember\s+(?P<x>to\s+.+)"),
    ("en", r"(?<=please )remember\s+(?P<x>.+)"),
    ("en", r"(?:please\s+)?(?:note|make a note)(?:\s+that\b|\s*:)\s*(?P<x>.+)"),
    ("en", r"keep in mind(?:\s+that\b|\s*:)?\s*(?P<x>.+)"),
    ("en", r"(?:don't|do not) forget(?:\s+that\b|\s*:)\s*(?P<x>.+)"),
    ("en", r"for the record[,:]\s*(?P<x>.+)"),
    ("de", r"merk(?:e)? dir[,:]?\s*(?:dass\s+)?(?P<x>.+)"),
    ("de", r"(?:bitte\s+)?merken\s*:\s*(?P<x>.+)"),
    ("de", r"notiere[,:]?\s*(?:dass\s+)?(?P<x>.+)"),
    ("fr", r"(?:souviens-toi|rappelle-toi|retiens|note)\s+(?:que|qu')\s*(?P<x>.+)"),
    ("es", r"(?:recuerda|acuérdate de|toma nota de|anota)\s+que\s+(?P<x>.+)"),
    ("pt", r"(?:lembra|lembre-se(?: de)?|anota|anote)\s+que\s+(?P<x>.+)"),
]
FORGET_PATTERNS = [
    (
        "en",
        r"forget(?:\s+about)?(?:\s+(?:everything|what i (?:said|told you)) about)?\s+"
        r"(?P<x>(?:my|that|i|i'm|i've|what|the|about)\b.+)",
    ),
    ("de", r"vergiss(?:\s+bitte)?[,:]?\s*(?:dass\s+)?(?P<x>.+)"),
    ("fr", r"oublie(?:\s+que|\s+qu')?\s*(?P<x>.+)"),
    ("es", r"(?:olvida(?:\s+que)?|olvídate de)\s+(?P<x>.+)"),
    ("pt", r"(?:esquece|esqueça)(?:\s+que)?\s+(?P<x>.+)"),
]
_REMEMBER = [(lang, re.compile(_POLITE + p, re.I)) for lang, p in REMEMBER_PATTERNS]
_FORGET = [(lang, re.compile(_POLITE + p, re.I)) for lang, p in FORGET_PATTERNS]
_ASKING = re.compile(
    r"(?:please\s+)?(?:can|could|would|will) you\b|kannst du|könntest du|puedes|podrías"
    r"|pode|podes|peux-tu|pourrais-tu",
    re.I,
)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_CONSTRAINT_START = re.compile(r"(always|never|don't|do not|only|avoid)\b", re.I)
_PREFERENCE = re.compile(r"\b(prefer|like|love|hate|dislike|enjoy|favou?rite)s?\b", re.I)
MAX_CHARS = 500


@dataclass
class Commands:
    """What the user explicitly asked for in one message."""

    remember: list[tuple[str, str]] = field(default_factory=list)  # (content, kind)
    forget: list[str] = field(default_factory=list)  # what to forget, in the user's words


def parse_commands(text: str) -> Commands:
    """Every explicit remember / forget request in `text` (see the module docstring)."""
    found = Commands()
    for sentence in _SENTENCE.split(text or ""):
        sentence = sentence.strip().strip("\"'“”")
        if sentence.endswith("?"):
            if not _ASKING.match(sentence):
                continue  # "remember when we met?" is a question, "can you forget ...?" is not
            sentence = sentence.rstrip("?").strip()
        if not sentence:
            continue
        for _lang, pattern in _FORGET:
            match = pattern.fullmatch(sentence)
            if match and (target := _clean(match.group("x"))):
                found.forget.append(target)
                break
        else:
            for lang, pattern in _REMEMBER:
                match = pattern.fullmatch(sentence)
                if match and (target := _clean(match.group("x"))):
                    found.remember.append(_as_fact(target, lang))
                    break
    return found


# Every forget pattern holds one of these: a message without any asks to forget nothing.
_FORGET_VERBS = ("forget", "vergiss", "oubli", "olvid", "olvíd", "esquec", "esqueç")


def asks_to_forget(text: str) -> bool:
    """Whether `text` holds a forget request, as `parse_commands` finds them. Checked on
    every chat before it goes upstream (memory_core/jobs.py orders such jobs), so a
    message naming no forget verb (nearly all) costs a substring scan, not the grammar
    (0.7 us for a short message, 0.17 ms for 46 kB, against 13 ms for the grammar)."""
    folded = (text or "").casefold()
    return any(verb in folded for verb in _FORGET_VERBS) and bool(parse_commands(text).forget)


def _clean(text: str) -> str:
    text = " ".join(text.split()).strip(" .!,;:\"'“”")
    return text[:MAX_CHARS]


def _as_fact(target: str, lang: str) -> tuple[str, str]:
    """A memory sentence and its kind for a remember request."""
    if lang == "en":
        if re.match(r"to\s+", target, re.I):  # "remember to always answer in French"
            target = target[3:].strip()
        if _CONSTRAINT_START.match(target):
            return target[0].upper() + target[1:], "constraint"
        sentence = third_person(target)
        kind = "preference" if _PREFERENCE.search(target) else "fact"
        return sentence[0].upper() + sentence[1:], kind
    return f"The user asked to remember: {target}", "note"


_MODALS = {"can", "can't", "cannot", "could", "will", "won't", "would", "should", "must",
           "might", "may", "shall", "'ll", "'d", "used"}  # fmt: skip
_IRREGULAR = {"am": "is", "'m": "is", "have": "has", "'ve": "has", "do": "does",
              "don't": "doesn't", "was": "was", "go": "goes"}  # fmt: skip
_WORDS = {"my": "the user's", "me": "the user", "myself": "the user", "mine": "the user's",
          "i'm": "the user is", "i've": "the user has", "i'll": "the user will",
          "i'd": "the user would"}  # fmt: skip


def _conjugate(verb: str) -> str:
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low in _MODALS or not low.isalpha():
        return verb
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def third_person(text: str) -> str:
    """`I live in Munich and my cat is Tom` -> `the user lives in Munich and the user's
    cat is Tom`: a rewrite good enough for simple first-person statements."""
    words = text.split(" ")
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        bare = word.strip(",.;:!").lower().replace("’", "'")
        tail = word[len(word.rstrip(",.;:!")) :]
        if bare == "i" and i + 1 < len(words):
            nxt = words[i + 1].strip(",.;:!")
            out.append("the user")
            out.append(_conjugate(nxt) + words[i + 1][len(nxt) :])
            i += 2
            continue
        if bare == "i":
            out.append("the user" + tail)
        elif bare in _WORDS:
            out.append(_WORDS[bare] + tail)
        else:
            out.append(word)
        i += 1
    return " ".join(out)
