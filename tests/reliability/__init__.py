"""The reliability harness: faults, reload storms and hostile input through a whole daemon.

Fast and deterministic by construction (state-synchronised, bounded); the long runs of the
same scenarios live in ``bench/soak.py``, which reuses its machinery from :mod:`iop_edge.testing`.
"""
