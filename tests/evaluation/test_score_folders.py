"""Score tables in the shapes other tools write: a folder of parts, hive-partitioned (scoretable.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ipi.evaluation import evaluate_score_table, read_score_table
from tests.conftest import SHARED

pytestmark = pytest.mark.needs_shared
CASES = SHARED / "protocol_cases"


def _numbers(results: dict) -> dict:
    """The estimands and intervals of results.json, as the protocol cases' expected files hold them."""
    out = {"e1": results["e1"]["estimate"], "ci": {"e1": [results["e1"]["ci_low"], results["e1"]["ci_high"]]}}
    for c, v in results["e3"].items():
        out[f"e3.{c}"] = v["estimate"]
        out["ci"][f"e3.{c}"] = [v["ci_low"], v["ci_high"]]
    return out


def _partitioned(table: pd.DataFrame, folder, by: list[str]):
    """The table as pandas/pyarrow write it with ``partition_cols``, with Spark's ``_SUCCESS`` marker."""
    table.to_parquet(folder, partition_cols=by, index=False)
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


def _csv_parts(table: pd.DataFrame, folder, n: int = 3):
    """The table as Spark writes CSV with a header: ``part-0000k.csv`` files, ``_SUCCESS``, ``.crc``."""
    folder.mkdir()
    size = -(-len(table) // n)
    for k in range(n):
        table.iloc[k * size:(k + 1) * size].to_csv(folder / f"part-{k:05d}.csv", index=False)
        (folder / f".part-{k:05d}.csv.crc").write_bytes(b"\x00crc")
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


@pytest.mark.parametrize("case", ["basic", "ties_and_missing", "two_attacks_per_step"])
def test_partitioned_folder_gives_the_flat_files_estimands(tmp_path, case):
    flat = CASES / f"{case}.csv"
    table = pd.read_csv(flat, dtype={"trajectory_id": str, "variant": str})
    folders = [_partitioned(table, tmp_path / "by_variant.parquet", ["variant"]),
               _partitioned(table, tmp_path / "by_trajectory", ["trajectory_id"]),
               _partitioned(table, tmp_path / "by_both", ["variant", "step"]),
               _csv_parts(table, tmp_path / "csv_parts")]
    want = evaluate_score_table(flat, n_boot=200)
    expected = json.loads((CASES / f"{case}.expected.json").read_text())
    for folder in folders:
        got = evaluate_score_table(folder, n_boot=200)
        assert got["e1"] == want["e1"] and got["e3"] == want["e3"] and got["counts"] == want["counts"], folder
        assert got["e1"]["estimate"] == pytest.approx(expected["e1"], abs=1e-12), folder
        for c in got["e3"]:
            assert got["e3"][c]["estimate"] == pytest.approx(expected[f"e3.{c}"], abs=1e-12), (folder, c)
        back = read_score_table(folder)
        # partition columns come back as the schema's types, not categoricals
        assert back["step"].dtype == "int64" and back["variant"].map(type).eq(str).all()
        assert back["trajectory_id"].map(type).eq(str).all()
        key = ["trajectory_id", "step", "variant", "score"]
        pd.testing.assert_frame_equal(back[key].sort_values(key).reset_index(drop=True),
                                      read_score_table(flat)[key].sort_values(key).reset_index(drop=True))


def test_partition_values_are_kept_as_written(tmp_path):
    # ids that a type-inferring reader would turn into numbers or NaN stay the strings they are
    rows = [(tid, s, v, sc + k) for k, tid in enumerate(("007", "NA", "1e3", "a b/c")) for s in (0, 1)
            for v, sc in (("clean", 0.1 * s), ("attack", 0.5 + 0.3 * s))]
    table = pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])
    back = read_score_table(_partitioned(table, tmp_path / "p", ["trajectory_id"]))
    assert sorted(set(back["trajectory_id"])) == sorted({"007", "NA", "1e3", "a b/c"})


def test_folders_that_are_not_a_score_table_say_what_they_are(tmp_path):
    empty = tmp_path / "empty"
    (empty / "_temporary").mkdir(parents=True)
    (empty / "_SUCCESS").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty: a folder with no part file \(\.csv, \.parquet or \.pq\)"):
        read_score_table(empty)
    table = pd.read_csv(CASES / "basic.csv")
    mixed = _csv_parts(table, tmp_path / "mixed")
    table.to_parquet(mixed / "part-9.parquet")
    with pytest.raises(ValueError, match=r"mixed: a score-table folder holds part files of one format .*"
                                         r"found \.csv, \.parquet"):
        read_score_table(mixed)
    odd = _csv_parts(table, tmp_path / "odd")
    (odd / "part-00003.json").write_text("{}")
    with pytest.raises(ValueError, match=r"found \.csv, \.json \(e\.g\. .*part-00003\.json\)"):
        read_score_table(odd)
    # a bad row is named by its part file and line
    bad = _csv_parts(table, tmp_path / "bad")
    part = pd.read_csv(bad / "part-00001.csv", dtype=str)
    part.loc[4, "score"] = "oops"
    part.to_csv(bad / "part-00001.csv", index=False)
    with pytest.raises(ValueError, match=r"bad: column 'score' .*part-00001\.csv row 4, line 6"):
        read_score_table(bad)


def test_evaluate_task_reads_a_partitioned_folder(tmp_path):
    from hydra import compose, initialize_config_dir

    from ipi.run.schemas import register_configs
    from ipi.run.tasks import evaluate
    from tests.conftest import REPO

    table = pd.read_csv(CASES / "basic.csv", dtype={"trajectory_id": str, "variant": str})
    folder = _partitioned(table, tmp_path / "scores.parquet", ["variant"])
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            f"scores={folder}", f"paths.output_dir={tmp_path / 'out'}", "evaluation.n_boot=100",
            "report.plots=false", "report.html=false"])
    evaluate(cfg)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    expected = json.loads((CASES / "basic.expected.json").read_text())
    assert results["e1"]["estimate"] == pytest.approx(expected["e1"], abs=1e-12)
    assert _numbers(results)["e3.c_scrambled"] == pytest.approx(expected["e3.c_scrambled"], abs=1e-12)
