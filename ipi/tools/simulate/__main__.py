"""``python -m ipi.tools.simulate``."""

from ipi.tools.simulate.command import main

if __name__ == "__main__":
    main()
