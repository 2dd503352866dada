"""Command-line tools: ``python -m ipi.tools.cache`` (activation cache), ``python -m ipi.tools.bench`` (timings), ``python -m ipi.tools.simulate`` (self-test on simulated data)."""
