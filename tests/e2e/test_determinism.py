"""Determinism: the same command twice gives bit-identical outputs; another bootstrap seed moves only intervals."""

from __future__ import annotations

import json

import pytest

from tests.conftest import (
    N_ROWS,
    _base,
    compose_train,
)

# ----------------------------------------------------------------------------- determinism


def _intervals(obj, path=""):
    """Every ``{estimate, ci_low, ci_high, n_boot_used}`` interval in results, by dotted path."""
    if isinstance(obj, dict):
        if "estimate" in obj and "ci_low" in obj:
            yield path, obj
        for k, v in obj.items():
            yield from _intervals(v, f"{path}.{k}" if path else k)


def _without_intervals_and_bootstrap(obj):
    if isinstance(obj, dict):
        if "estimate" in obj and "ci_low" in obj:
            return {"estimate": obj["estimate"]}
        return {k: _without_intervals_and_bootstrap(v) for k, v in obj.items()
                if k not in ("bootstrap", "verdict", "p_values", "reportability")}
    if isinstance(obj, list):
        return [_without_intervals_and_bootstrap(v) for v in obj]
    return obj


@pytest.mark.needs_shared
def test_same_command_twice_fresh_caches_bit_identical(tmp_path, syn_root, reference, one_thread):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from ipi.run.tasks import train

    train(compose_train(tmp_path, _base(syn_root)))
    assert (tmp_path / "run" / "results.json").read_bytes() == \
        (reference / "run" / "results.json").read_bytes()
    assert (tmp_path / "run" / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()
    (a,) = (reference / "cache").iterdir()
    (b,) = (tmp_path / "cache").iterdir()
    assert a.name == b.name  # same key
    shards = sorted(p.name for p in a.glob("shard-*.safetensors"))
    assert shards == sorted(p.name for p in b.glob("shard-*.safetensors")) and len(shards) == N_ROWS // 5
    for name in shards:
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys() == {"features", "collapse", "prompt_len", "seq_len"}
        for k in ta:
            assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape
            # bit-identical, not merely close
            assert ta[k].contiguous().view(torch.uint8).equal(tb[k].contiguous().view(torch.uint8)), (name, k)
        with safe_open(str(a / name), "pt") as fa, safe_open(str(b / name), "pt") as fb:
            assert fa.metadata() == fb.metadata()  # same row ids, same key
    # (The shard files' bytes may differ: safetensors writes its header metadata in hash order.)


@pytest.mark.needs_shared
def test_other_bootstrap_seed_changes_only_the_intervals(tmp_path, syn_root, reference, one_thread):
    from ipi.run.tasks import train

    (tmp_path / "cache").symlink_to(reference / "cache")
    train(compose_train(tmp_path, [*_base(syn_root), "evaluation.seed=1"]))
    r0 = json.loads((reference / "run" / "results.json").read_text())
    r1 = json.loads((tmp_path / "run" / "results.json").read_text())
    assert _without_intervals_and_bootstrap(r0) == _without_intervals_and_bootstrap(r1)
    i0, i1 = dict(_intervals(r0)), dict(_intervals(r1))
    assert i0.keys() == i1.keys() and len(i0) >= 8
    changed = [k for k in i0 if (i0[k]["ci_low"], i0[k]["ci_high"]) != (i1[k]["ci_low"], i1[k]["ci_high"])]
    assert len(changed) >= len(i0) // 2, changed
    assert (tmp_path / "run" / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()
