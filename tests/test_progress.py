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


def test_extraction_bar_counts_rows_not_batches(capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("IPI_QUIET", raising=False)
    progress.set_quiet(False)
    (bar,) = progress.extraction_callbacks(total_rows=12)

    class Trainer:  # what the callback reads from Lightning's Trainer
        is_global_zero, world_size = True, 1

    bar.on_predict_start(Trainer(), None)
    for n in (5, 5, 2):  # three batches (step groups of 5, 5 and 2 rows)
        bar.on_predict_batch_end(Trainer(), None, None, {"row_ids": [f"r{i}" for i in range(n)]}, 0)
    bar.on_predict_end(Trainer(), None)
    err = capsys.readouterr().err
    assert "extraction (rows)" in err and "12/12" in err and "3/12" not in err


def test_quiet_silences_transformers_and_hub_bars_and_warnings(monkeypatch):
    import logging

    import huggingface_hub
    import transformers

    for var in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS"):
        monkeypatch.delenv(var, raising=False)
    before = transformers.utils.logging.get_verbosity()
    try:
        progress.set_quiet(True)
        assert transformers.utils.logging.get_verbosity() == logging.ERROR
        assert not transformers.utils.logging.is_progress_bar_enabled()
        assert huggingface_hub.utils.are_progress_bars_disabled()
        import os

        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        # A transformers warning (logger) is not printed in quiet mode.
        handler_records = []

        class Grab(logging.Handler):
            def emit(self, record):
                handler_records.append(record)

        h = Grab()
        transformers.utils.logging.get_logger("transformers.test").addHandler(h)
        transformers.utils.logging.get_logger("transformers.test").warning("loud")
        assert handler_records == []
    finally:
        transformers.utils.logging.set_verbosity(before)
        transformers.utils.logging.enable_progress_bar()
        huggingface_hub.utils.enable_progress_bars()


def test_a_log_file_gets_plain_progress_lines_with_eta(capsys, monkeypatch):
    """stderr redirected to a file: no live bar, so a line at the start, every LINE_EVERY_S (from a
    thread: tests/test_progress_long_work.py) and at the end."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("IPI_QUIET", raising=False)
    progress.set_quiet(False)
    clock = iter([0.0, 0.0, 100.0])  # the bar's start, its first line, its last line
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.progress_bar("extraction (rows)", 12) as bar:
        for n in (3, 3, 3):
            bar.advance(n)
    lines = capsys.readouterr().err.splitlines()
    # 9 of 12 done in 100 s: 3 left at 100/9 s each -> ETA 33 s
    assert lines == ["extraction (rows): 0/12 (0 %), elapsed 0:00:00, ETA ?",
                     "extraction (rows): 9/12 (75 %), elapsed 0:01:40, ETA 0:00:33"]
