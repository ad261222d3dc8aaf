"""``python -m specbench.cli``: the ``specbench`` command."""

from specbench.cli import main

main()
