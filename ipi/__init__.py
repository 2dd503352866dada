"""ipi: does a hidden-state probe detect indirect prompt injection, or a shortcut?

The package implements ``PROTOCOL.md`` (kept in ``docs/protocol.md`` references): replay of
recorded web-agent trajectories through a frozen vision-language backbone, injection surfaces
and nuisance-matched controls, hidden-state extraction, a linear probe, and the estimands
E1/E2/E3, baselines C1/C2, cluster-bootstrap CIs and the verdict.
"""

__version__ = "0.1.0"
