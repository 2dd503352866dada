"""Entry point: `python extract.py [overrides]` (see README). A thin wrapper around ipi.run.tasks.extract."""

import hydra
from omegaconf import DictConfig

from ipi.run.schemas import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="extract")
def main(cfg: DictConfig) -> None:
    from ipi.run.cli import run_entry
    from ipi.run.tasks import extract

    run_entry(extract, cfg)


if __name__ == "__main__":
    main()
