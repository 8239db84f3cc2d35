"""Measurements of the product (``python benchmarks/<name>.py``; docs/performance.md quotes them).

A package so that tests import a benchmark's functions by name (``from benchmarks import
repeat_probe``) without patching ``sys.path``; each module still runs as a script.
"""
