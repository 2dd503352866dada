"""Behaviour under injection: free-run generation, hijack labels and the ablation test.

Teacher-forced replay measures whether the hidden states *register* an injection; this package
asks whether the agent *follows* it: :mod:`~ipi.behaviour.generate` (the backbone's own next
action), :mod:`~ipi.behaviour.labels` (``hijacked``, ``resisted`` or ``other``) and
:mod:`~ipi.behaviour.ablation` (a direction projected out during generation). E4 and the hijack
rates are in :mod:`ipi.evaluation.hijack`. Every function takes typed inputs; docs/behaviour.md."""
