"""Experiment harnesses behind committed results: ``scripts/<area>/`` backs ``results/<area>/``.

Run each from the repository root as a module (``python -m scripts.heads.by_category RUN``; the shell
scripts with ``bash scripts/load/experiment.sh``). Importing one runs nothing; ``tests/test_scripts.py``
imports them all and holds them to specbench's public names. Outputs committed before the move record
the command by its old path, ``python results/<area>/<name>.py``."""
