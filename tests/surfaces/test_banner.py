"""The banner's word wrap: the galloping search gives exactly the word-by-word greedy lines."""

from __future__ import annotations

import random

import pytest

from ipi.surfaces.bank import BENIGN_IMPERATIVES, all_attack_texts
from ipi.surfaces.banner import _worst_case, load_font, wrap_text


def greedy_wrap(text: str, font, max_width: int) -> list[str]:
    """The reference: measure after every word, break over-long words char by char."""
    lines: list[str] = []
    for para in text.split("\n"):
        cur = ""
        for word in para.split(" "):
            cand = word if not cur else f"{cur} {word}"
            if font.getlength(cand) <= max_width:
                cur = cand
                continue
            if cur:
                lines.append(cur)
            cur = ""
            piece = ""
            for ch in word:
                if piece and font.getlength(piece + ch) > max_width:
                    lines.append(piece)
                    piece = ""
                piece += ch
            cur = piece
        lines.append(cur)
    return [ln.rstrip() for ln in lines]


def _texts() -> list[str]:
    bank = list(all_attack_texts())
    rng = random.Random(0)
    words = " ".join(bank[:40]).split(" ") + ["", "", "Supercalifragilisticexpialidocious" * 3, "a", "—", "x\ny"]
    odd = ["", " ", "  ", "\n", "a  b", "  lead", "trail  ", "one\n\ntwo", "W" * 200, "m " * 50,
           " ".join(rng.choice(words) for _ in range(60))]
    odd += [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 80))) for _ in range(40)]
    return bank[::7] + [_worst_case(t) for t in bank[::23]] + list(BENIGN_IMPERATIVES)[:20] + odd


@pytest.mark.parametrize("size", [8, 13, 21])
def test_wrap_text_equals_word_by_word_greedy(size):
    font = load_font(size, None)
    rng = random.Random(size)
    for text in _texts():
        for width in (1, 5, 40, rng.randrange(60, 400), 900):
            assert wrap_text(text, font, width) == greedy_wrap(text, font, width), (text[:60], width)
