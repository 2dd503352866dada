"""Files ipi writes read back line by line whatever their strings hold (ipi.io.text_lines)."""

from __future__ import annotations

import json

from ipi.io import text_lines

#: Every character ``str.splitlines`` splits at besides "\n".
SPLITLINES_ONLY = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r"]


def test_text_lines_split_at_newline_only(tmp_path):
    records = [{"job_id": f"j{i}", "message": f"a{c}b"} for i, c in enumerate(SPLITLINES_ONLY)]
    path = tmp_path / "journal.jsonl"
    # JSON Lines as a writer with ensure_ascii=False leaves them: raw inside the strings
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records))
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(records)  # what str.splitlines makes of it
    assert [json.loads(x) for x in text_lines(path)] == records
    # a Windows line end is one line end; no final empty line; a bad byte under errors="replace"
    crlf = tmp_path / "lock"
    crlf.write_bytes(b"123\r\nhost\xff\r\n")
    assert text_lines(crlf, errors="replace") == ["123", "host\ufffd"]
