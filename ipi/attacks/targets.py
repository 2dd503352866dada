"""What a hijack labeller looks for: URLs, e-mail recipients, accounts and elements in a goal's text.

Sources add what the text alone cannot tell (a credential, an abandon token, a tool name) from
their own data; this module finds the kinds a regular expression finds reliably:

* ``recipient``: e-mail addresses (``amy.watson@gmail.com``);
* ``url``: ``http(s)://`` URLs, ``www.`` hosts and bare host names with a common top-level
  domain (``superdupersketchycorp.biz``), e-mail domains excluded, trailing punctuation cut;
* ``account``: IBAN-shaped strings (two capitals, two digits, 10–30 capitals/digits);
* ``element``: ``element [n]`` references of the project bank (``[7]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["extract_targets", "merge_targets"]

_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_URL = re.compile(r"\bhttps?://[^\s\"'<>()\[\]]+|\bwww\.[^\s\"'<>()\[\]]+")
_HOST = re.compile(r"\b(?:[a-z0-9-]+\.)+(?:com|org|net|biz|io|ly|info|example)\b(?:/[^\s\"'<>()\[\]]*)?",
                   re.IGNORECASE)
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}[A-Z0-9]{10,30}\b")
_ELEMENT = re.compile(r"\belement (\[\d+\])")
_TRAIL = ".,;:!?'\"`*_"


def _clean(u: str) -> str:
    return u.rstrip(_TRAIL)


def extract_targets(text: str) -> dict[str, tuple[str, ...]]:
    """Targets found in ``text`` (module docstring), each kind in order of first occurrence.

    Args:
        text: A goal text.

    Returns:
        Kind → values; kinds with nothing found are absent.
    """
    out: dict[str, list[str]] = {}
    emails = [_clean(m) for m in _EMAIL.findall(text)]
    rest = _EMAIL.sub(" ", text)
    urls = [_clean(m) for m in _URL.findall(rest)]
    bare = _URL.sub(" ", rest)
    urls += [_clean(m) for m in _HOST.findall(bare)]
    for kind, vals in (("recipient", emails), ("url", urls), ("account", _IBAN.findall(text)),
                       ("element", _ELEMENT.findall(text))):
        vals = [v for v in dict.fromkeys(vals) if v]
        if vals:
            out[kind] = vals
    return {k: tuple(v) for k, v in out.items()}


def merge_targets(*parts: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """Union of target mappings, per kind in order of first occurrence, empty kinds dropped."""
    out: dict[str, list[str]] = {}
    for p in parts:
        for k, vals in p.items():
            out.setdefault(k, [])
            out[k] += [str(v) for v in vals if str(v)]
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items() if v}
