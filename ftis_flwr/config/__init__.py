"""The experiment's configuration: the typed dataclasses (:mod:`.schema`), every choice's allowed
values (:mod:`.choices`), YAML presets and run-config merging (:mod:`.merge`, :mod:`.presets`),
the dotted fields and value conversion they share (:mod:`.fields`), YAML layers checked key by key
(:mod:`.yaml_layers`),
validation with every error at once (:mod:`.validation`), the flat ``--run-config`` keys
(:mod:`.keys`) and their reference page (:mod:`.reference`), dtype resolution (:mod:`.dtypes`), the
memory plan (:mod:`.plan`) and pinned node keys (:mod:`.node_keys`).

May import only :mod:`ftis_flwr.maths` (its torch-free :mod:`~ftis_flwr.maths.params`): checking a
configuration imports neither torch nor Flower. This ``__init__`` re-exports nothing; import from the
module that defines a name.
"""
