"""``python -m structgen``: the ``structgen`` command line."""

from structgen.cli import main

if __name__ == "__main__":
    main()
