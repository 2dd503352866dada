"""Behaviour under injection: free-run generation, hijack labels and the ablation test.

Teacher-forced replay measures whether the hidden states *register* an injection; this package asks
whether the agent *follows* it. :mod:`~ipi.behaviour.generate` lets the backbone generate its next
action from the replay prompt without the gold action (greedy, bounded, batched, cached by
content); :mod:`~ipi.behaviour.labels` labels each action ``hijacked``, ``resisted`` or ``other``
(one rule per goal family); :mod:`~ipi.behaviour.ablation` projects a direction out of the residual
stream during generation. E4 and the hijack rates with their cluster-bootstrap intervals are in
:mod:`ipi.evaluation.hijack`. Every function takes typed inputs (no config); docs/behaviour.md.
"""
