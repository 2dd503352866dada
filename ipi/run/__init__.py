"""The run layer: the only code that reads the composed Hydra config (``cfg``).

The entry scripts (``train.py``, ``extract.py``, ``evaluate.py``) call :mod:`ipi.run.tasks`
through :func:`ipi.run.cli.run_entry`; everything below this package takes typed settings or
plain arguments (docs/README.md, the code map).
"""
