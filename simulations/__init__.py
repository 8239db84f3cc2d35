"""The lab's wing: the study harness (``python -m simulations.<tool>`` from the repository's root).

Why a package: its tools share the run and grid code (``runs``, ``sweep_grid``, ``sweep_report``,
``paired``) and tests and benchmarks import them by name, without patching ``sys.path``. It is
not part of the installed library (``pyproject.toml`` packages ``ftis_flwr`` only) nor of the
Flower app bundle: run it from a clone.
"""
