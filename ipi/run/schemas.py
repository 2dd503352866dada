"""Structured-config schemas: a typo or an unknown option fails when Hydra composes the config.

Every config group is typed by a dataclass below and registered in Hydra's ConfigStore as
``<group>/schema``; each YAML option lists that schema first in its defaults. Enum-typed fields
make OmegaConf reject unknown controls, token groups and split kinds with a message naming the
key and the allowed values. Cross-field rules are :func:`ipi.run.validation.validate`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from ipi.data.discover import ON_BAD_STEP, UNKNOWN_ACTION_POLICIES
from ipi.evaluation.results import C1_MAX, COLLAPSE_CEILING, MIN_BOOT_FRACTION, MIN_CLUSTERS
from ipi.metrics.bootstrap import INTERVAL, LEVEL, N_BOOT, SEED
from ipi.metrics.operating_point import DEFAULT_FPR
from ipi.metrics.permutation import ALPHA
from ipi.protocol import (
    CONTROLS,
    DEFAULT_SYSTEM_PROMPT,
    TOKEN_GROUPS,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _vocabulary_enum(name: str, values: tuple[str, ...], doc: str) -> type[Enum]:
    """A ``str`` enum whose members are ``values`` (from :mod:`ipi.protocol`), for OmegaConf checks."""
    enum = Enum(name, [(v, v) for v in values], type=str, module=__name__)
    enum.__doc__ = doc
    return enum


# Built from ipi.protocol so that the schemas accept exactly the protocol's names. (Surfaces are
# not an enum: conf/surface/<name>.yaml names each surface's class; run_surface checks it.)
Control = _vocabulary_enum("Control", CONTROLS, "Nuisance-matched controls (PROTOCOL.md §2).")
TokenGroup = _vocabulary_enum("TokenGroup", TOKEN_GROUPS, "Token groups pooled per layer (PROTOCOL.md §3).")


class SplitKind(str, Enum):
    """Trajectory split designs (PROTOCOL.md §4)."""

    holdout = "holdout"
    kfold = "kfold"


class WordingScheme(str, Enum):
    """How the attack wording is held out (``split.wording``; :mod:`ipi.attacks.wording`)."""

    bank = "bank"  # the run's attack pool split at random into families aligned with the folds
    source = "source"  # leave-one-source-out: fold i tests on attack source i only (attack=mix)


class ProbeSolver(str, Enum):
    """How the probe's convex objective is minimised (docs/probe.md); both reach the same minimiser."""

    newton = "newton"  # exact Newton, primal (d <= n) or through the Gram matrix (d > n)
    lbfgs = "lbfgs"  # torch.optim.LBFGS with strong-Wolfe line search


class IntervalKind(str, Enum):
    """Bootstrap interval methods (docs/estimands.md; percentile is PROTOCOL.md §5's)."""

    expanded = "expanded"  # the percentile interval at a tail widened for few clusters (the default)
    percentile = "percentile"
    bca = "bca"


class Quantization(str, Enum):
    """Weight quantisation of a pretrained backbone (bitsandbytes through ``BitsAndBytesConfig``)."""

    none = "none"
    int8 = "int8"
    nf4 = "nf4"


class BehaviourMeasure(str, Enum):
    """Which hijack measure the behaviour stage computes (``behaviour.measure``; docs/behaviour.md §6)."""

    likelihood = "likelihood"  # teacher-forced log p(goal action) - log p(gold action): no generation
    free_run = "free_run"  # greedy generation labelled hijacked / resisted / other
    both = "both"


OnBadStep = _vocabulary_enum("OnBadStep", ON_BAD_STEP, "What the importer does with an unusable step: "
                             "a counted skip, or an error.")
UnknownAction = _vocabulary_enum("UnknownAction", UNKNOWN_ACTION_POLICIES, "What the importer does with a step "
                                 "whose action it does not know (docs/reliability.md).")


class OverContext(str, Enum):
    """What a run does with a step whose prompt is longer than the backbone's context (docs/reliability.md)."""

    skip = "skip"  # leave the step out (every variant), counted in results.json counts.skipped_steps
    truncate = "truncate"  # cut the step's page text from its end until every variant fits (counted)
    error = "error"  # stop before any forward pass, naming the trajectory, step and both counts


@dataclass
class SurfaceConf:
    """Where the injection lands: ``conf/surface/<name>.yaml`` (docs/surfaces.md)."""

    _target_: str = MISSING  # the surface's class (ipi.surfaces.surface.Surface subclass), built without arguments
    name: str = MISSING  # must be that class's name (run_surface)
    n_attacks: int = 1  # attack rows per step (templates drawn per (trajectory, step, k))


@dataclass
class AttackConf:
    """Where attack and benign texts come from: ``conf/attack/<name>.yaml`` (docs/attacks.md)."""

    _target_: str = MISSING  # the attack source class (ipi.attacks.*Source), one of ipi.attacks.available_sources
    name: str = MISSING  # must be that class's family
    sources: Optional[list[str]] = None  # a mix's members (null: every attack source)
    benign: Optional[str] = "notinject"  # c_imperative texts for a source that has none (null: refuse)


@dataclass
class ControlConf:
    """Which controls run. ``names: null`` means every control that applies to the surface."""

    name: str = "all"
    names: Optional[list[Control]] = None


@dataclass
class LayersConf:
    """Decoder layers as fractions of depth in (0, 1] (floats) or block indices (ints)."""

    name: str = MISSING
    spec: list[Any] = MISSING


@dataclass
class TokenGroupConf:
    """Token groups the probe reads (all five are always extracted and cached)."""

    name: str = MISSING
    names: list[TokenGroup] = MISSING


@dataclass
class DataConf:
    """Trajectory source."""

    kind: str = "webvoyager"  # the format's name (messages): webvoyager | online_mind2web | multimodal_mind2web | browser_use | native
    # the importer: a _target_ node (_partial_: true) binding the settings below that it takes;
    # called as importer(root, image_limits=..., **options); its _target_ is resolved by validate()
    importer: Any = MISSING
    root: str = MISSING  # folder searched recursively for task folders (or a .jsonl for native)
    on_bad_step: OnBadStep = OnBadStep.skip
    unknown_action: UnknownAction = UnknownAction.keep  # keep (action_type "unknown") | skip | error
    max_element_chars: Optional[int] = 3000  # truncate page text (keeps prompts bounded)
    max_trajectories: Optional[int] = None  # first N usable trajectories by id (quick runs); later folders are not read
    options: dict[str, Any] = field(default_factory=dict)  # importer-specific keyword arguments


@dataclass
class BackboneConf:
    """A frozen backbone: ``loader`` is a ``_target_`` node that returns an ``ipi.backbone.Backbone``."""

    name: str = MISSING
    n_layers: int = MISSING  # decoder blocks; checked against the loaded model
    hidden_size: int = MISSING
    multimodal: bool = True
    # Whether the backbone's own weights are trained. False (the tiny default, built with random
    # weights): the verdict licenses at most "separates ..." (docs/estimands.md, check 6).
    pretrained: bool = MISSING
    # A planted-truth backbone whose weights were constructed, not trained: the verdict
    # does not cap it (check 6 runs with its twins) and says it is constructed (not a model of any agent).
    constructed: bool = False
    tokenizer_path: str = MISSING  # where the tokenizer lives (used without loading the model)
    tokenizer_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {gguf_file: ...}
    image_size: Optional[dict[str, int]] = None  # {shortest_edge, longest_edge} in total pixels
    batch_size: int = 1  # rows per forward pass (not part of the cache key)
    cache_dtype: str = "float32"
    quantization: Quantization = Quantization.none  # int8 | nf4 need a CUDA GPU + bitsandbytes
    system_prompt: str = MISSING
    loader: Any = MISSING


@dataclass
class ProbeConf:
    """Linear probe (PROTOCOL.md §4): standardised, L2 logistic regression, balanced classes."""

    # scikit-learn's C (inverse regularisation strength): the pre-registered constant 1.0, or
    # "auto" = grouped inner CV over l2_grid on each fold's training trajectories (docs/probe.md)
    l2: Any = 1.0
    l2_grid: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.1, 1.0, 10.0])
    # newton: exact full-batch Newton solve (seconds); lbfgs: torch LBFGS (the same minimiser, slower)
    solver: ProbeSolver = ProbeSolver.newton
    max_iter: int = 500
    tol: float = 1e-8


@dataclass
class LogisticDetectorConf:
    """``detector=logistic``: today's probe; its settings are ``probe.*`` (docs/probe.md)."""

    _target_: str = "ipi.detectors.LogisticDetector"
    name: str = "logistic"
    permutation_m: Optional[int] = None  # check 4's refits M; None: evaluation.permutation.m


@dataclass
class DiffMeansDetectorConf:
    """``detector=diff_means``: mass-mean probe on standardised features (docs/detectors.md)."""

    _target_: str = "ipi.detectors.DiffMeansDetector"
    name: str = "diff_means"
    permutation_m: Optional[int] = None


@dataclass
class MLPDetectorConf:
    """``detector=mlp``: one hidden layer, early-stopped on held-out training trajectories."""

    _target_: str = "ipi.detectors.MLPDetector"
    name: str = "mlp"
    hidden: int = 64
    alpha: float = 1e-3
    learning_rate: float = 1e-3
    batch_size: int = 64
    max_epochs: int = 200
    patience: int = 10
    val_fraction: float = 0.2
    seed: int = 0
    permutation_m: Optional[int] = None


@dataclass
class AttentionFocusDetectorConf:
    """``detector=attention_focus``: last prompt token's attention on task vs untrusted span."""

    _target_: str = "ipi.detectors.AttentionFocusDetector"
    name: str = "attention_focus"
    top_k: int = 4  # heads combined (chosen on training rows)
    layers: Optional[list[Any]] = None  # fractions in (0, 1] or indices; None: the run's layers
    permutation_m: Optional[int] = None


@dataclass
class ExternalDetectorConf:
    """``detector=external``: a score table the user brings (``trajectory_id, step, variant, score``)."""

    _target_: str = "ipi.detectors.ExternalDetector"
    name: str = "external"
    scores: str = MISSING  # CSV/Parquet scoring every test row of the run's split
    label: str = MISSING  # the detector's name in the report (e.g. a paper or repository)
    permutation_m: Optional[int] = None  # unused: an external detector is not refitted


DETECTOR_SCHEMAS = {
    "logistic": LogisticDetectorConf,
    "diff_means": DiffMeansDetectorConf,
    "mlp": MLPDetectorConf,
    "attention_focus": AttentionFocusDetectorConf,
    "external": ExternalDetectorConf,
}


@dataclass
class SplitConf:
    """Trajectory-disjoint split."""

    kind: SplitKind = SplitKind.holdout
    # Each applies to one kind only (split=holdout sets test_fraction, split=kfold sets k); giving
    # the other kind's option is refused by validate(), never silently ignored.
    test_fraction: Optional[float] = None  # holdout only (conf/split/holdout.yaml: 0.5)
    k: Optional[int] = None  # kfold only: number of folds (conf/split/kfold.yaml: 5)
    seed: int = 0  # the pre-registered split
    min_per_side: int = 2  # fewest trajectories on each side (train, test) of every fold; checked right after import
    # held-out attack wording (evaluation.heldout_wording): bank = the attack pool split at random
    # into families aligned with the folds; source = leave-one-source-out (attack=mix, split=kfold,
    # split.k = number of attack sources): fold i's test rows draw template and goal from source i
    wording: WordingScheme = WordingScheme.bank
    # >1: also rerun the split with seeds seed+1 .. seed+repeats-1 and report each estimand's
    # spread and how many seeds license each claim beside the pre-registered verdict
    repeats: int = 1


@dataclass
class PermutationConf:
    """Exact permutation test of verdict check 4 (PROTOCOL.md §7.4; docs/estimands.md)."""

    m: int = 199  # permuted-label refits; 0 = not run (check 4 NOT RUN)
    seed: int = 0  # seed of the within-(trajectory, step) label permutations
    alpha: float = ALPHA  # PASS needs p <= alpha (and a null mean near 0.5)


@dataclass
class EvaluationConf:
    """Estimands, bootstrap and verdict (PROTOCOL.md §5–§7)."""

    # the defaults of the bootstrap, the verdict and the gate are the library's (ipi.metrics.bootstrap,
    # ipi.evaluation.results), also used where no config exists (a bare score table, the self-test)
    n_boot: int = N_BOOT
    seed: int = SEED
    level: float = LEVEL
    # expanded (default: the percentile interval at Hesterberg's widened tail) | percentile
    # (PROTOCOL.md §5, the protocol cases of §9) | bca; coverage measured in docs/selftest.md
    interval: IntervalKind = IntervalKind(INTERVAL)
    collapse_ceiling: float = COLLAPSE_CEILING
    c1_max: float = C1_MAX
    # the operating point: TPR at this false-positive rate, attack vs clean and vs each control,
    # with cluster-bootstrap intervals (reported, decides nothing; docs/estimands.md)
    operating_fpr: float = DEFAULT_FPR
    # an estimand with fewer effective test trajectories (Kish, from the weights it uses, on its
    # poorer side) is not used: the checks relying on it are NOT RUN (docs/estimands.md)
    min_clusters: int = MIN_CLUSTERS
    # An estimate whose bootstrap kept fewer than this fraction of n_boot replicates is marked
    # not reportable in the report, the forest plot and W&B (docs/outputs.md).
    min_boot_fraction: float = MIN_BOOT_FRACTION
    permuted: bool = True  # the single permuted-label fit (PROTOCOL.md §6; reported, decides nothing)
    permutation: PermutationConf = field(default_factory=PermutationConf)
    collapse_only: bool = True  # run the collapse-only baseline (C2)
    transfer: bool = True  # cross-surface transfer: train on the other surfaces, score this one
    # Held-out attack wording (PROTOCOL.md §7 check 3): test trajectories' attack templates, goals
    # and benign imperatives come from bank families no training trajectory uses (docs/surfaces.md)
    heldout_wording: bool = True
    # One sweep cell named before the sweep by its overrides ("layers=six_3 token_group=task"):
    # python -m ipi.reporting.sweep licenses it at the nominal level; the rest under Holm (docs/sweeps.md)
    preregistered: Optional[str] = None
    # The random-weight twin (docs/backbones.md): the same architecture and config with seeded
    # random weights, extracted on the same rows, probed on the same folds; verdict check 6
    # needs it ("detects" is never licensed without it).
    # true | false | auto (default: on for a pretrained or constructed backbone, off for a backbone
    # whose own weights are random, whose claim is capped at "separates" anyway)
    random_twin: Any = "auto"
    # Torch seeds of the twins' weights (the tiny backbone's own is 0), one cache entry and one
    # probe per seed; check 6 needs the trained backbone to beat every seed (docs/estimands.md:
    # S seeds bound the false pass from init variance at 1/(S+1)).
    # 19 seeds: the rank test of check 6 reaches level 1/(S+1) = 0.05 (PROTOCOL.md §7.6)
    random_twin_seeds: list[int] = field(default_factory=lambda: list(range(1, 20)))
    # Replaced by random_twin_seeds; kept only so that the old key fails with a clear message.
    random_twin_seed: Any = None  # any type: a list ([1]) must reach the message too


@dataclass
class AblationConf:
    """``behaviour.ablation``: project the probe's direction out during free run (docs/behaviour.md §4)."""

    enabled: bool = True  # with behaviour.enabled: the probe / random / no-ablation arms on the attack rows
    # decoder blocks whose output loses the direction: fractions in (0, 1] or indices, each one of the
    # probe's layers; null: every layer the probe reads
    layers: Optional[list[Any]] = None
    seed: int = 0  # seed of the random control direction (numpy default_rng([seed, layer]))


@dataclass
class BehaviourConf:
    """Free-run behaviour under injection (docs/behaviour.md): off by default.

    On, the backbone writes its own next action for the test rows, each is labelled hijacked /
    resisted / other, and results.json gains ``behaviour`` (hijack rates, E4 "predicts hijack",
    the ablation "uses this direction"); the verdict's claim is never changed by it.
    """

    enabled: bool = False
    # likelihood: the teacher-forced hijack propensity (every backbone with an LM head, no generation);
    # free_run: generation and labels; both (the default: the free-run block and the likelihood beside it)
    measure: BehaviourMeasure = BehaviourMeasure.both
    max_new_tokens: int = 96  # bound on generated tokens per row (a WebVoyager turn is ~30-80)
    batch_size: int = 4  # rows per generate call (left-padded; not part of the generation cache key)
    # variants generated and labelled: null = every variant of the run (attack, clean, its controls);
    # must hold attack (E4 and the ablation read the attack rows)
    variants: Optional[list[str]] = None
    ablation: AblationConf = field(default_factory=AblationConf)


@dataclass
class ExtractConf:
    """Extraction runtime (none of it enters the cache key)."""

    cache_dir: str = MISSING
    # DataLoader workers rendering/tokenising ahead of the forward pass; "auto" = 0 on a CPU run
    # (the cores are the forward's), min(8, cores - 1) when the run uses a GPU
    num_workers: Any = "auto"
    shard_rows: int = 256
    accelerator: str = "auto"
    devices: Any = 1
    strategy: str = "auto"
    precision: str = "32-true"  # or "auto": bf16-mixed on a bf16-capable GPU, else 32-true
    force: bool = False  # ignore an existing cache entry and extract again
    # Forward a step group's shared token prefix once (key/value cache), then each row's suffix:
    # auto (where it saves >= 20 % of the positions) | true | false. Same features to 1e-5; not in
    # the cache key (docs/extraction.md).
    prefix_reuse: Any = "auto"
    # Layer superset every extraction reads and keys its cache on (fractions, indices or
    # ["all"]); runs select their `layers` from it, so layer sweeps reuse one cache entry.
    layers: list[Any] = field(default_factory=lambda: [i / 6 for i in range(1, 7)])
    # Random-weight twins forwarded on each prepared batch (one data pass for all; docs/extraction.md):
    # "auto" = all on a CPU, as many as fit in 70 % of the free memory on a GPU; or a positive integer
    twins_per_pass: Any = "auto"
    # A step whose replayed sequence (image tokens included) is longer than the backbone's context
    # (max_position_embeddings of its model config): skip (counted) | truncate (the step's page
    # text cut from its end until every variant fits; counted) | error; checked before any forward
    over_context: OverContext = OverContext.skip


@dataclass
class ReportConf:
    """What a run writes for people besides ``results.json`` (docs/outputs.md)."""

    plots: bool = True  # roc.png and forest.png
    html: bool = True  # report.html (self-contained, figures embedded)
    gallery: bool = True  # gallery.png of one test step (shows a screenshot; never uploaded unless allowed)


@dataclass
class PathsConf:
    root_dir: str = MISSING
    shared_dir: str = MISSING
    output_dir: str = MISSING


@dataclass
class TrainConf:
    """Top-level config of ``train.py``."""

    task_name: str = "train"
    seed: int = 0
    quiet: bool = False
    paths: PathsConf = field(default_factory=PathsConf)
    data: DataConf = field(default_factory=DataConf)
    backbone: BackboneConf = field(default_factory=BackboneConf)
    surface: SurfaceConf = field(default_factory=SurfaceConf)
    attack: AttackConf = field(default_factory=AttackConf)
    control: ControlConf = field(default_factory=ControlConf)
    layers: LayersConf = field(default_factory=LayersConf)
    token_group: TokenGroupConf = field(default_factory=TokenGroupConf)
    probe: ProbeConf = field(default_factory=ProbeConf)
    # one of DETECTOR_SCHEMAS (conf/detector/<name>.yaml lists detector/<name>_schema first)
    detector: Any = None
    split: SplitConf = field(default_factory=SplitConf)
    evaluation: EvaluationConf = field(default_factory=EvaluationConf)
    extract: ExtractConf = field(default_factory=ExtractConf)
    report: ReportConf = field(default_factory=ReportConf)
    behaviour: BehaviourConf = field(default_factory=BehaviourConf)
    logger: Any = None


@dataclass
class EvaluateConf:
    """Top-level config of ``evaluate.py``: a score table in, results out."""

    task_name: str = "evaluate"
    scores: str = MISSING
    # The same probe's score table on the random-weight twins' features (same rows; column
    # twin_seed, one block per seed: train.py's scores_twin.csv), for verdict check 6; without it
    # check 6 is NOT RUN and "detects" is not licensed (docs/estimands.md).
    twin_scores: Optional[str] = None
    backbone_pretrained: Optional[bool] = None  # false caps the claim at "separates ..." (check 6)
    backbone_constructed: bool = False  # a constructed (planted-truth) backbone's scores: not capped
    paths: PathsConf = field(default_factory=PathsConf)
    evaluation: EvaluationConf = field(default_factory=EvaluationConf)
    report: ReportConf = field(default_factory=ReportConf)
    # the split design that produced the scores (split=kfold for out-of-fold scores: verdict check 1
    # then needs check 4's permutation test, which a score table cannot give)
    split: SplitConf = field(default_factory=SplitConf)


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConf)
    cs.store(name="evaluate_schema", node=EvaluateConf)
    for name, node in DETECTOR_SCHEMAS.items():
        cs.store(group="detector", name=f"{name}_schema", node=node)
    if not OmegaConf.has_resolver("ipi_repo"):
        OmegaConf.register_new_resolver("ipi_repo", lambda: str(REPO_ROOT))
    if not OmegaConf.has_resolver("ipi_package_dir"):
        OmegaConf.register_new_resolver("ipi_package_dir", _package_dir)
    if not OmegaConf.has_resolver("replay_system_prompt"):
        OmegaConf.register_new_resolver("replay_system_prompt", lambda: DEFAULT_SYSTEM_PROMPT)


def _package_dir(name: str) -> str:
    """Folder of an installed package, found without importing it (``${ipi_package_dir:NAME}``).

    Raises:
        ValueError: The package is not installed (the message says how to install it).
    """
    from ipi.backbone_text import package_dir

    return str(package_dir(name))
