"""The drivers behind the tables and figures of docs/: ``python -m experiments.NAME --help``."""
