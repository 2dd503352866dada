"""Entry point: `python evaluate.py [overrides]` (see README). A thin wrapper around ipi.pipeline.evaluate."""

import hydra
from omegaconf import DictConfig

from ipi.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from ipi.cli import run_entry
    from ipi.pipeline import evaluate

    run_entry(evaluate, cfg)


if __name__ == "__main__":
    main()
