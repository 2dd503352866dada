"""The free run says how many rows it has tokenised and generated, with an ETA (tests/test_progress_long_work.py)."""

from __future__ import annotations

import pytest

from tests.test_progress_long_work import _lines, _shown  # noqa: F401 (the fixture shows the bars)

@pytest.mark.needs_shared
def test_free_run_reports_rows_generated(text_backbone, dom_rows, capsys):
    from ipi.behaviour.generate import GenerationSettings, generate, requests_of_rows
    from tests.behaviour.conftest import SYSTEM

    reqs = requests_of_rows(text_backbone, dom_rows, SYSTEM)
    tokenised = _lines(capsys.readouterr().err, "free run: tokenising prompts")
    assert tokenised[0] == (0, str(len(dom_rows))) and tokenised[-1] == (len(dom_rows), str(len(dom_rows)))
    generate(text_backbone, reqs, GenerationSettings(max_new_tokens=2, batch_size=2))
    gen = _lines(capsys.readouterr().err, "free run: generating")
    n = len(reqs)
    assert gen[0] == (0, str(n)) and gen[-1] == (n, str(n))
