"""Nuisance-matched control texts (PROTOCOL.md §2).

* :func:`scramble` — gibberish with the same character count and layout as a text.
* :func:`benign_imperative` — benign UI imperatives cut to an exact character count.
* :func:`match_token_count` — trim or extend a text until a tokenizer counts a target number
  of tokens; :func:`scramble_tokens` combines it with :func:`scramble` for the text surfaces
  (``i_dom``, ``i_tool``), where the control must match the attack's token count rather than
  its character count.
* :func:`imperative_sentences` — the ``c_imperative`` text of the text surfaces: *whole*
  benign sentences, chosen (and padded with short neutral sentences) to the attack's exact
  token count; never a sentence cut mid-way (docs/surfaces.md, *Token matching*).

Every function is deterministic: randomness comes from ``random.Random`` seeded with the
SHA-256 of a caller-given ``seed_key`` (never from Python's salted ``hash()``).
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable

from ipi.surfaces.bank import BENIGN_IMPERATIVES, NEUTRAL_SENTENCES

CountTokens = Callable[[str], int]


def _rng(seed_key: str, purpose: str) -> random.Random:
    digest = hashlib.sha256(f"{purpose}\x1f{seed_key}".encode()).hexdigest()
    return random.Random(int(digest, 16))


def scramble(text: str, seed_key: str) -> str:
    """Replace the content of ``text`` by deterministic gibberish of the same layout.

    Character classes map as follows (one output character per input character, so
    ``len(out) == len(text)`` and every position keeps its class):

    * ASCII letters → random ASCII letters of the same case;
    * decimal digits (any script) → random ASCII digits ``0-9``;
    * non-ASCII letters → random ASCII letters: uppercase if the letter is uppercase, lowercase
      otherwise (caseless scripts such as Thai map to lowercase ASCII);
    * everything else (spaces, tabs, newlines, punctuation, symbols, combining marks) is kept.

    Args:
        text: The text to scramble (usually an attack text).
        seed_key: Seed; the same key always gives the same output, different keys differ.

    Returns:
        The scrambled text.
    """
    rng = _rng(seed_key, "scramble")
    out = []
    for c in text:
        if c.isdecimal():
            out.append(rng.choice(string.digits))
        elif c.isalpha():
            if c.isupper():
                out.append(rng.choice(string.ascii_uppercase))
            else:
                out.append(rng.choice(string.ascii_lowercase))
        else:
            out.append(c)
    return "".join(out)


# Filler words used to pad benign_imperative to an exact length, by length (all benign).
_FILLER = {2: "ok", 3: "now", 4: "more", 5: "below", 6: "thanks", 7: "options", 8: "settings"}


def _filler(m: int) -> str:
    """Space-separated filler words of exactly ``m >= 2`` characters."""
    if m <= 8:
        return _FILLER[m]
    first = min(8, m - 3)  # leave at least 2 characters (plus a space) for the rest
    return _FILLER[first] + " " + _filler(m - first - 1)


def _imperative_stream(seed_key: str, min_len: int, bank=None) -> str:
    """Shuffled rounds of ``bank`` (default BENIGN_IMPERATIVES) joined by spaces, >= ``min_len`` long."""
    bank = BENIGN_IMPERATIVES if bank is None else tuple(bank)
    if not bank:
        raise ValueError("benign imperatives: empty bank")
    rng = _rng(seed_key, "imperative")
    parts: list[str] = []
    total = -1
    while total < min_len:
        round_ = list(bank)
        rng.shuffle(round_)
        for s in round_:
            parts.append(s)
            total += len(s) + 1
    return " ".join(parts)


def benign_imperative(target_len: int, seed_key: str, bank=None) -> str:
    """Return benign UI imperatives of exactly ``target_len`` characters.

    The imperatives of ``bank`` are shuffled (seeded by ``seed_key``; more rounds appended when
    one is too short) and joined by single spaces, then cut at a word boundary exactly at
    ``target_len``, or else at the last word boundary leaving a gap of at least 3 characters,
    the gap filled with a space plus benign filler words of exactly the missing length. Targets
    below 3 characters are a plain prefix.

    Args:
        target_len: Number of characters wanted (``>= 0``).
        seed_key: Seed (e.g. ``"<trajectory>|<step>|c_imperative"``).
        bank: Imperatives to draw from (a held-out wording family); default every entry of
            :data:`~ipi.surfaces.bank.BENIGN_IMPERATIVES`.

    Returns:
        A string with ``len(result) == target_len`` that never ends with a space.

    Raises:
        ValueError: ``target_len`` is negative.
"""
    if target_len < 0:
        raise ValueError(f"target_len must be >= 0, got {target_len}")
    stream = _imperative_stream(seed_key, target_len + 1, bank)
    if target_len < 3 or stream[target_len] == " ":
        return stream[:target_len]
    # Last boundary b (a space index, or 0 = start) with gap target_len - b >= 3.
    b = stream.rfind(" ", 0, target_len - 2)
    if b <= 0:
        return _filler(target_len)
    return stream[:b] + " " + _filler(target_len - b - 1)


def _boundaries(s: str) -> list[int]:
    """Prefix lengths of ``s`` that end at a word boundary (before a space, or the end)."""
    out = [i for i in range(1, len(s)) if s[i] == " " and s[i - 1] != " "]
    if s and s[-1] != " ":
        out.append(len(s))
    return out


def match_token_count(
    text: str,
    target_tokens: int,
    count_tokens: CountTokens,
    *,
    max_calls: int = 800,
) -> str:
    """Trim or extend ``text`` until ``count_tokens`` gives exactly ``target_tokens``.

    The result is a prefix of the stream ``text + " " + text + ...``, possibly followed by one
    or two words of the text. Search order, stopping at the first exact match:

    1. the longest word-boundary prefix whose count is ``<= target_tokens`` (binary search, then
       a scan of neighbouring boundaries: prefix counts are only nearly monotone);
    2. that prefix, or one of up to four shorter word-boundary prefixes, plus one or two whole
       words of ``text`` (as written, then with surrounding punctuation stripped);
    3. the prefix of step 1 extended character by character into the next word.

    Within ``max_calls`` calls of ``count_tokens`` and no exact match, the candidate closest to
    the target (ties: the shorter) is returned.

    Args:
        text: Source text (its words are the only material used).
        target_tokens: Token count wanted.
        count_tokens: Function returning the number of tokens of a string.
        max_calls: Budget of ``count_tokens`` calls.

    Returns:
        The matched text (``""`` if ``target_tokens <= 0`` or ``text`` is blank).
"""
    if target_tokens <= 0 or not text.strip():
        return ""
    calls = 0
    cache: dict[str, int] = {}

    def count(s: str) -> int:
        nonlocal calls
        if s not in cache:
            calls += 1
            cache[s] = count_tokens(s)
        return cache[s]

    if count(text) == target_tokens:
        return text
    stream = text
    while count(stream) < target_tokens and calls < max_calls // 2:
        stream = stream + " " + text
    bounds = _boundaries(stream)

    # 1. Binary search: largest boundary index with count <= target.
    lo, hi = 0, len(bounds) - 1
    best = -1
    while lo <= hi and calls < max_calls:
        mid = (lo + hi) // 2
        if count(stream[: bounds[mid]]) <= target_tokens:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    for i in range(max(0, best - 3), min(len(bounds), best + 4)):
        if calls >= max_calls:
            break
        if count(stream[: bounds[i]]) == target_tokens:
            return stream[: bounds[i]]

    # 2. A prefix ending at one of the last few boundaries, plus one whole word of the text
    #    (words as written, then with surrounding punctuation stripped), then plus two words.
    words = list(dict.fromkeys(w for w in text.split() if w))
    stripped = [w.strip(string.punctuation) for w in words]
    vocab = list(dict.fromkeys(words + [w for w in stripped if w]))
    bases = [stream[: bounds[i]] if i >= 0 else "" for i in range(best, max(-1, best - 4) - 1, -1)]
    singles = [[w] for w in vocab]
    pairs = [[u, v] for u in vocab[:12] for v in vocab[:12]]
    plan = [(0, singles), (0, pairs), (1, singles), (1, pairs), (2, singles), (3, singles),
            (4, singles)]
    for b, exts in plan:
        if b >= len(bases):
            continue
        for ext in exts:
            if calls >= max_calls:
                break
            cand = " ".join(([bases[b]] if bases[b] else []) + ext)
            if count(cand) == target_tokens:
                return cand
    # 3. Cut inside the next word.
    nxt = bounds[best + 1] if best + 1 < len(bounds) else len(stream)
    start = bounds[best] if best >= 0 else 0
    for n in range(start + 1, nxt):
        if calls >= max_calls:
            break
        cand = stream[:n].rstrip()
        if cand and count(cand) == target_tokens:
            return cand
    # Closest candidate seen (ties: shorter).
    candidates = [(abs(v - target_tokens), len(s), s) for s, v in cache.items() if s.strip()]
    return min(candidates)[2]


def scramble_tokens(
    text: str,
    seed_key: str,
    count_tokens: CountTokens,
    *,
    target_tokens: int | None = None,
) -> str:
    """Scramble ``text`` and match the result's token count to the original's.

    The result is typically a prefix of :func:`scramble` ``(text, seed_key)`` (scrambled text
    tokenizes into more tokens).

    Args:
        text: The text to scramble (the attack text).
        seed_key: Seed passed to :func:`scramble`.
        count_tokens: Token counter; it may wrap the text in its context before counting.
        target_tokens: Token count wanted; default ``count_tokens(text)``.

    Returns:
        Gibberish with ``count_tokens(result) == target`` where :func:`match_token_count` can
        reach it exactly.
"""
    target = count_tokens(text) if target_tokens is None else target_tokens
    return match_token_count(scramble(text, seed_key), target, count_tokens)


def imperative_sentences(target_tokens: int, seed_key: str, count_tokens: CountTokens, *,
                         max_calls: int = 600, bank=None) -> str:
    """Whole benign imperative sentences with exactly ``target_tokens`` tokens (where reachable).

    The ``c_imperative`` control of the text surfaces (PROTOCOL.md §2; docs/surfaces.md,
    *Token matching*): **complete sentences only**, the exact count reached by choosing
    sentences and padding with neutral ones (:data:`~ipi.surfaces.bank.NEUTRAL_SENTENCES`);
    when no combination within the budget hits the count, the closest one is returned and the
    mismatch is reported (the row's ``token_delta``), never hidden by cutting a sentence.

    Search (deterministic, over a seeded shuffle of the bank):

    1. greedy fill: append each sentence that keeps the count ``<= target`` (then
       ``<= target - 2``, ``- 3``, ``- 4``: room for padding);
    2. pad the fill with one to three neutral sentences until the count is exact;
    3. otherwise start the walk at a later sentence and repeat;
    4. if every sentence once is shorter than the target, walk the order several times, so
       sentences recur.

    Args:
        target_tokens: Token count wanted.
        seed_key: Seed of the shuffles (e.g. ``"<trajectory>|<step>|c_imperative"``).
        count_tokens: Token counter; it may wrap the text in its context before counting.
        max_calls: Budget of ``count_tokens`` calls.
        bank: Imperatives to draw from (a held-out wording family); default the whole bank.

    Returns:
        Space-joined complete sentences (``""`` when ``target_tokens <= 0``).
"""
    if target_tokens <= 0:
        return ""
    rng = _rng(seed_key, "imperative-sentences")
    order = list(BENIGN_IMPERATIVES if bank is None else bank)
    rng.shuffle(order)
    pads = list(NEUTRAL_SENTENCES)
    rng.shuffle(pads)
    cache: dict[str, int] = {}

    def count(parts: list[str]) -> int:
        s = " ".join(parts)
        if s not in cache:
            cache[s] = count_tokens(s)
        return cache[s]

    limit = max_calls  # budget of distinct counted texts (raised once for the walk with repeats)

    def fill(walk: list[str], start: int, cap: int) -> list[str]:
        out: list[str] = []
        for i in range(len(walk)):
            if len(cache) >= limit or cap <= 0:
                break
            s = walk[(start + i) % len(walk)]
            if count(out + [s]) <= cap:
                out.append(s)
                if count(out) == cap:
                    break
        return out

    def padded(base: list[str]) -> list[str] | None:
        if base and count(base) == target_tokens:
            return base
        combos = [[p] for p in pads] + [[p, q] for p in pads for q in pads] + \
            [[p, q, r] for p in pads[:5] for q in pads[:5] for r in pads[:5]]
        for extra in combos:
            if len(cache) >= limit:
                return None
            if count(base + extra) == target_tokens:
                return base + extra
        return None

    def search(walk: list[str]) -> str | None:
        # Fill up to the target, or leave 2-4 tokens of room for the neutral padding; then other
        # starting points in the shuffled order.
        for start in (0, 7, 14, 21):
            for slack in (0, 2, 3, 4):
                hit = padded(fill(walk, start, target_tokens - slack))
                if hit is not None:
                    return " ".join(hit)
                if len(cache) >= limit:
                    break
        return None

    hit = search(order)
    if hit is not None:
        return hit
    # Each sentence once cannot reach the count (a held-out family of a source that ships few short
    # benign texts, e.g. AgentDojo's 6 against its attacks of up to 1,147 characters): walk the same
    # shuffled order again, so a sentence may recur, with a fresh budget. Texts the first walk
    # matched never get here, so they are unchanged.
    once = count(order)
    if 0 < once < target_tokens:
        limit = len(cache) + max_calls
        hit = search(order * (target_tokens // once + 1))
        if hit is not None:
            return hit
    # Closest complete-sentence text seen (ties: the shorter); the caller reports the mismatch.
    return min((abs(v - target_tokens), len(s), s) for s, v in cache.items() if s)[2]
