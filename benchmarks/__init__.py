"""Measurements of the product (``python -m benchmarks.<name>`` from the repository's root;
docs/performance.md quotes them).

A package so that benchmarks and tests import a benchmark's functions by name (``from benchmarks
import repeat_probe``) without patching ``sys.path``.
"""
