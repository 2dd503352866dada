"""The key strings of a run's results (``results.json``), each defined once (docs/outputs.md).

The typed results (:class:`ipi.metrics.compare.Estimates`, :class:`ipi.evaluation.results.Results`)
write their ``to_dict()`` with these names, and every reader of a results dict — the verdict, the
reportability marks, the reports, the sweep summary, W&B — reads with them (:func:`at` reads a dotted key). Torch-free, standard library only.

Layout (``{...}`` an interval ``{"estimate", "ci_low", "ci_high", "n_boot_used"}``)::

    e1, e1_paired, e2: {...}  e3: {control: {...}}
    <baseline>: {e1, e2, e3}                               # c1, collapse_only, permuted, transfer
    random_twin: {seeds, guards, by_seed: {seed: {e1, e2, e3}}}
    differences: {e1_minus_<baseline>_e1, e3_minus_<baseline>_e3, e1_minus_e3, e3_minus_mean_twin_e3}
    p_values: {e1, e1_paired, e3, e1_minus_<baseline>_e1, e3_minus_<baseline>_e3, e3_minus_mean_twin_e3}
    permutation: {...}       bootstrap: {n_boot, seed, level, n_clusters, interval, clusters_by_estimand,
                                         effective_clusters_by_estimand}
    source, source_twin, counts, verdict, reportability, run, split_spread, warnings: [str]
    behaviour: {labels_file, backbone_weights, settings, counts, rates: {surface: {variant: {...}}},
                e4: {e4, c1_e4, e4_minus_c1_e4, n_clusters, counts, reportable},
                ablation: {rates, changes, probe_minus_random, ...} | null,
                claims: {predicts_hijack, uses_direction}}      # only with behaviour.enabled
"""

from __future__ import annotations

from collections.abc import Mapping

# The estimands of one score table (PROTOCOL.md §5).
E1 = "e1"
E2 = "e2"
E3 = "e3"
ESTIMANDS = (E1, E2, E3)
#: E1 over the steps having both an attack and a clean row: what verdict check 1 is judged on
#: (never-attacked trajectories cannot license "separates"; docs/estimands.md).
E1_PAIRED = "e1_paired"

# Interval fields.
ESTIMATE = "estimate"
CI_LOW = "ci_low"
CI_HIGH = "ci_high"
N_BOOT_USED = "n_boot_used"

# The baselines a run fits beside the probe (PROTOCOL.md §5–§6), by the name they are stored under.
C1 = "c1"
COLLAPSE_ONLY = "collapse_only"
C2 = "c2"  # this project's other name for collapse_only (hand-built results)
PERMUTED = "permuted"
TRANSFER = "transfer"

# Top-level sections.
RANDOM_TWIN = "random_twin"
DIFFERENCES = "differences"
P_VALUES = "p_values"
PERMUTATION = "permutation"
BOOTSTRAP = "bootstrap"
SOURCE = "source"
SOURCE_TWIN = "source_twin"
COUNTS = "counts"
VERDICT = "verdict"
REPORTABILITY = "reportability"
RUN = "run"
SPLIT_SPREAD = "split_spread"
SPLIT_REPEATS = "split_repeats"  # handed from the pipeline to the report, never written
#: Sentences a reader must see beside the numbers (an input that can drive an estimand), in the report too
WARNINGS = "warnings"

# random_twin.*
SEEDS = "seeds"
BY_SEED = "by_seed"

# differences.* (and p_values.*, clusters_by_estimand.differences.*)
E1_MINUS_E3 = "e1_minus_e3"
#: E3[c] − mean over twin seeds of E3_s[c] (check 6's paired interval)
E3_MINUS_MEAN_TWIN_E3 = "e3_minus_mean_twin_e3"
#: random_twin.guards: why the twin tables cannot be judged (check 6 NOT RUN); empty when they can
GUARDS = "guards"


def e1_minus_baseline_e1(baseline: str) -> str:
    """Key of the paired difference ``E1 − <baseline> E1`` (e.g. ``e1_minus_c1_e1``)."""
    return f"e1_minus_{baseline}_e1"


E1_MINUS_C1_E1 = e1_minus_baseline_e1(C1)


def e3_minus_baseline_e3(baseline: str) -> str:
    """Key of the paired differences ``E3[c] − <baseline> E3[c]`` per control (e.g. ``e3_minus_c1_e3``)."""
    return f"e3_minus_{baseline}_e3"


E3_MINUS_C1_E3 = e3_minus_baseline_e3(C1)

# bootstrap.* (``_KEY``: the values of the same names are ipi.metrics.bootstrap's defaults)
N_BOOT_KEY = "n_boot"
SEED_KEY = "seed"
LEVEL_KEY = "level"
N_CLUSTERS = "n_clusters"
INTERVAL_KEY = "interval"
CLUSTERS_BY_ESTIMAND = "clusters_by_estimand"
#: Kish effective test trajectories per estimand, same tree as clusters_by_estimand (the gate's count)
EFFECTIVE_CLUSTERS_BY_ESTIMAND = "effective_clusters_by_estimand"

# permutation.* read by the verdict and the reports
P_VALUE = "p_value"
NULL_MEAN = "null_mean"

OPERATING_POINT = "operating_point"  # TPR at a fixed FPR (ipi.metrics.operating_point)
#: Free-run behaviour (docs/behaviour.md): written only by a run with behaviour.enabled
BEHAVIOUR = "behaviour"

# verdict.* and verdict.checks[].*
CLAIM = "claim"
CLAIM_NOTE = "claim_note"
CHECKS = "checks"
CHECK_ID = "id"
NAME = "name"
STATUS = "status"
DETAIL = "detail"
NUMBERS = "numbers"
RULE = "rule"
PERMUTATION_P = "permutation_p"  # verdict.checks[].numbers of check 1 under K-fold
# verdict.min_clusters, reportability.{min_clusters, min_boot_fraction}
MIN_CLUSTERS_KEY = "min_clusters"
MIN_BOOT_FRACTION_KEY = "min_boot_fraction"

# run.*
SURFACE = "surface"
BACKBONE = "backbone"
BACKBONE_WEIGHTS = "backbone_weights"
BACKBONE_PRETRAINED = "backbone_pretrained"  # run.random_twin.*
LAYERS = "layers"
LAYERS_CONFIG = "layers_config"
TOKEN_GROUPS = "token_groups"
DETECTOR = "detector"
SPLIT = "split"
DATA_ROOT = "data_root"
ATTACK = "attack"  # run.attack: {name, pool, counts, by_source, by_goal_family, heldout_source, transfer, ...}
LABEL = "label"  # run.detector.label
POOL = "pool"
BY_SOURCE = "by_source"
BY_GOAL_FAMILY = "by_goal_family"
HELDOUT_SOURCE = "heldout_source"
ESTIMANDS_KEY = "estimands"  # run.attack.by_source.<s>.estimands, split_spread.estimands
N_TRAJECTORIES = "n_trajectories"  # run.attack.by_source.<s>.*, run.attack.transfer.*
BENIGN_FROM = "benign_from"
SOURCES = "sources"  # run.attack.transfer.sources
TEMPLATES, GOALS, BENIGN = "templates", "goals", "benign"  # run.attack.pool.*
# run.attack.counts.*
ATTACK_ROWS, ADAPTED_ROWS = "attack_rows", "adapted_rows"
BANNER_OVERFLOW_ROWS, CONTROL_TOKEN_MISMATCHES = "banner_overflow_rows", "control_token_mismatches"

# operating_point.*
FPR = "fpr"
VS = "vs"
N_NEGATIVE_STEPS = "n_negative_steps"

# split_spread.* (beside SEEDS, ESTIMANDS_KEY, CLAIMS)
N_SPLITS = "n_splits"
PREREGISTERED_SEED = "preregistered_seed"
SPREAD_MIN, SPREAD_MEDIAN, SPREAD_MAX = "min", "median", "max"

# counts.*
REPLACED_CHARACTERS = "replaced_characters"
COUNT = "count"

# permutation.* (beside P_VALUE, NULL_MEAN)
M_KEY = "m"
P_KEY = "p"  # read where p_value is absent
NULL_SD = "null_sd"
NULL_Q025 = "null_q025"
NULL_Q975 = "null_q975"
TOLERANCE = "tolerance"
N_GE = "n_ge"
E1_REFIT = "e1_refit"
DESIGN = "design"

# behaviour.* (docs/behaviour.md)
NOTE = "note"
CLAIMS = "claims"
LIKELIHOOD = "likelihood"
SETTINGS = "settings"
RATES = "rates"
BY_VARIANT = "by_variant"
E4 = "e4"
C1_E4 = "c1_e4"
E4_MINUS_C1_E4 = "e4_minus_c1_e4"
REPORTABLE = "reportable"
SHIFT_REPORTABLE = "shift_reportable"
SPEARMAN = "spearman"
MEAN_SHIFT = "mean_shift"
NOT_ESTIMABLE = "not_estimable"
ABLATION = "ablation"
CHANGES = "changes"
CHANGED_LABELS = "changed_labels"
PROBE_MINUS_RANDOM = "probe_minus_random"
N_ROWS = "n_rows"
ARM_NONE, ARM_PROBE, ARM_RANDOM = "none", "probe", "random"  # ablation arms
LOWERS_SHIFT = "lowers_shift"  # behaviour.likelihood.claims.*
PREDICTS_HIJACK, USES_DIRECTION = "predicts_hijack", "uses_direction"  # behaviour.claims.*, likelihood.claims.*
LABELS_FILE, TABLE_FILE, SCORED = "labels_file", "table_file", "scored"  # behaviour.*, behaviour.likelihood.*
VARIANTS, MAX_NEW_TOKENS = "variants", "max_new_tokens"  # behaviour.settings.*
RANDOM_SEED = "random_seed"  # ablation.*
# behaviour.counts.*, behaviour.likelihood.counts.* (beside ATTACK_ROWS)
ROWS, TRAJECTORIES, UNPARSED, CUT_BY_MAX_NEW_TOKENS = "rows", "trajectories", "unparsed", "cut_by_max_new_tokens"
WITH_GOAL_ACTION, NO_GOAL_ACTION_BY_FAMILY = "with_goal_action", "no_goal_action_by_family"
HIJACKED, RESISTED, OTHER = "hijacked", "resisted", "other"  # the labels: counts.by_variant.<variant>.*, e4.counts.*
# behaviour.likelihood.e4.counts.*
SHIFT_POSITIVE, SHIFT_NOT_POSITIVE, NO_GOAL_ACTION = "shift_positive", "shift_not_positive", "no_goal_action"

#: Keys of the results a baseline name may not take (they would collide with a section).
RESERVED_KEYS = frozenset(
    {E1, E2, E3, DIFFERENCES, BOOTSTRAP, COUNTS, VERDICT, SOURCE, "baselines", PERMUTATION, P_VALUES, RANDOM_TWIN,
     OPERATING_POINT, BEHAVIOUR, WARNINGS}
)


def at(results: Mapping, key: str):
    """The value at a dotted key of a results dict (``random_twin.by_seed.1.e3.c_scrambled``), or
    None where the path is absent."""
    cur = results
    for part in key.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def dotted(*parts) -> str:
    """A dotted estimand key (``differences.e1_minus_e3.c_scrambled``), as the reportability marks and
    the verdict's cluster gate name estimands."""
    return ".".join(map(str, parts))
