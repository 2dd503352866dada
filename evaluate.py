"""Entry point: `python evaluate.py [overrides]` (see README). A thin wrapper around ipi.run.tasks.evaluate."""

import hydra
from omegaconf import DictConfig

from ipi.run.schemas import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from ipi.run.cli import run_entry
    from ipi.run.tasks import evaluate

    run_entry(evaluate, cfg)


if __name__ == "__main__":
    main()
