"""specbench: benchmark speculative-decoding algorithms and reproduce their papers' tables."""

__version__ = "0.1.0"
