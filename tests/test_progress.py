"""Progress bars: items pass through unchanged; quiet mode prints nothing."""

from __future__ import annotations

import pytest

from ipi import progress


@pytest.fixture(autouse=True)
def _reset():
    yield
    progress.set_quiet(None)


def test_track_shows_bar_with_eta_and_passes_items(capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("IPI_QUIET", raising=False)
    progress.set_quiet(False)
    assert list(progress.track(iter(range(5)), "rendering", total=5)) == [0, 1, 2, 3, 4]
    err = capsys.readouterr().err
    assert "rendering" in err and "5/5" in err and "ETA" in err
    cbs = progress.extraction_callbacks(total_rows=7)
    assert len(cbs) == 1 and cbs[0].description == "extraction (rows)" and cbs[0].total_rows == 7


def test_quiet_mode_prints_nothing(capsys, monkeypatch):
    progress.set_quiet(True)
    assert list(progress.track([1, 2], "import")) == [1, 2]
    with progress.progress_bar("bootstrap", 1) as bar:
        bar.advance()
    assert capsys.readouterr() == ("", "")
    assert progress.extraction_callbacks() == []
    progress.set_quiet(None)
    monkeypatch.setenv("CI", "true")
    assert progress.is_quiet() is True
    monkeypatch.delenv("CI")
    monkeypatch.setenv("IPI_QUIET", "1")
    assert progress.is_quiet() is True
    monkeypatch.setenv("IPI_QUIET", "0")
    assert progress.is_quiet() is False
