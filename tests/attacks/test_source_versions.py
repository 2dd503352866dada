"""An installed attack-source package at another release than the one ipi was tested with.

agentdojo is the only source read from an installed package (injecagent, garak and notinject are
shipped files with their commit). A release that gives other texts is refused in one line naming
the installed release, the tested one and the pip command; a release whose texts are identical
is accepted and its version recorded in the run's attack record.
"""

from __future__ import annotations

import re
import shutil
from importlib import metadata

import pytest

from ipi.attacks.agentdojo import AgentDojoSource, package_root
from ipi.attacks.source import AttackSourceError, load_data

TESTED = "0.1.35"  # package.tested of ipi/attacks/data/agentdojo.yaml (asserted below)


def _installed_as(monkeypatch, version: str, root=None):
    """Make importlib.metadata report ``version`` for agentdojo (files at ``root``, default the real ones)."""
    real_version, real_dist = metadata.version, metadata.distribution
    real_root = package_root()[0]

    class Dist:
        def __init__(self):
            self.version = version

        def locate_file(self, name):
            return (root or real_root.parent) / name

    monkeypatch.setattr(metadata, "version", lambda n: version if n == "agentdojo" else real_version(n))
    monkeypatch.setattr(metadata, "distribution", lambda n: Dist() if n == "agentdojo" else real_dist(n))


def test_tested_release_gives_the_recorded_digest():
    from ipi.attacks.agentdojo import texts_digest

    assert str(load_data("agentdojo.yaml")["package"]["tested"]) == TESTED
    src = AgentDojoSource()
    assert package_root()[1] == TESTED  # the environment holds the tested release
    assert texts_digest(src.templates(), src.goals(), src.benign()) == load_data("agentdojo.yaml")["package"][
        "texts_digest"]
    assert src.accepted is None


def test_other_release_with_other_texts_is_one_line_naming_both_and_pip(monkeypatch, tmp_path, capsys):
    # An older release: the package's files lack a task ipi's families name (what 0.1.22 does).
    root = tmp_path / "site"
    shutil.copytree(package_root()[0], root / "agentdojo")
    for f in (root / "agentdojo" / "default_suites").glob("v*/travel/injection_tasks.py"):
        f.write_text(re.sub(r"class InjectionTask6\(", "class OldTask6(", f.read_text(encoding="utf-8")),
                     encoding="utf-8")
    _installed_as(monkeypatch, "0.1.22", root)
    with pytest.raises(AttackSourceError) as e:
        AgentDojoSource().goals()
    msg = str(e.value)
    assert "\n" not in msg
    assert "agentdojo 0.1.22 is installed" in msg and f"needs agentdojo {TESTED}" in msg
    assert f"pip install --no-deps 'agentdojo=={TESTED}'" in msg
    # the same package with the texts changed in place: refused as other texts
    for f in (root / "agentdojo" / "default_suites").glob("v*/travel/injection_tasks.py"):
        f.write_text(re.sub(r"class OldTask6\(", "class InjectionTask6(", f.read_text(encoding="utf-8")),
                     encoding="utf-8")
    f = root / "agentdojo" / "attacks" / "important_instructions_attacks.py"
    text = f.read_text(encoding="utf-8")
    assert "This is an important message" in text
    f.write_text(text.replace("This is an important message", "This is an urgent message"), encoding="utf-8")
    with pytest.raises(AttackSourceError, match=r"0\.1\.22 gives other texts.*pip install --no-deps"):
        AgentDojoSource().templates()

    # python -m ipi.attacks: no traceback, the reason on one line, the other sources still listed
    from ipi.attacks.__main__ import main

    assert main([]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    left = [line for line in err.splitlines() if line.startswith("python -m ipi.attacks: source agentdojo left out")]
    assert len(left) == 1 and "0.1.22 is installed" in left[0] and "pip install" in left[0]
    assert "| injecagent |" in out and "| agentdojo |" not in out


def test_other_release_with_identical_texts_is_accepted_and_recorded(monkeypatch):
    from ipi.attacks.pool import AttackPool
    from ipi.attacks.notinject import NotInjectSource
    from ipi.evaluation.by_source import attack_record
    from ipi.evaluation.results import DEFAULTS
    import pandas as pd

    expected = [g.text for g in AgentDojoSource().goals()]  # the tested release, installed here
    _installed_as(monkeypatch, "0.1.36")  # the same files under another release number
    src = AgentDojoSource()
    assert [g.text for g in src.goals()] == expected
    assert src.accepted is not None and "0.1.36" in src.accepted and TESTED in src.accepted
    (prov,) = src.provenance()
    assert prov.version == "0.1.36" and "identical to the tested" in prov.note
    pool = AttackPool.from_source(src, NotInjectSource())
    rec = attack_record(pool, [], pd.DataFrame({"trajectory_id": [], "step": [], "variant": [], "score": []}),
                        DEFAULTS)
    versions = {p["source"]: p["version"] for p in rec["provenance"]}
    assert versions["agentdojo"] == "0.1.36"
