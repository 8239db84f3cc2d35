"""ftis-flwr: collaborative GRPO across different LLMs with F-TIS, on Flower.

The package is cut along the architecture; each part imports only the parts below it
(``tests/test_layers.py`` checks it):

- :mod:`ftis_flwr.maths`: the loss family, advantages and the F-TIS filter (pure tensor code);
- :mod:`ftis_flwr.config`: the experiment's dataclasses, merging, validation, presets, memory plan;
- :mod:`ftis_flwr.tasks`: prompt sources and their rewards;
- :mod:`ftis_flwr.wire`: the groups nodes exchange and how they travel;
- :mod:`ftis_flwr.xtok`: aligning samples between different tokenizers;
- :mod:`ftis_flwr.node`: one institution's model, its worker process, engines and tiny models;
- :mod:`ftis_flwr.server`: the Flower strategy, its rounds, replies and reports;
- :mod:`ftis_flwr.cli`: ``ftis-flwr check|run`` (the check composes the configuration's rules
  and the task's reward probe).

The Flower app itself (``clients/client_app.py``, ``server_app/server_app.py``) lives beside the
package, in the app bundle.
"""
