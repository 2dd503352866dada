"""Entry point: `python train.py [overrides]` (see README). A thin wrapper around ipi.run.tasks.train."""

import hydra
from omegaconf import DictConfig

from ipi.run.schemas import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from ipi.run.cli import run_entry
    from ipi.run.tasks import train

    run_entry(train, cfg)


if __name__ == "__main__":
    main()
