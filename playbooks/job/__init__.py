"""The MaxText job: what it is and how it is submitted (``spec``: the
tutorial's job for a model with the inventory's and the user's changes,
checked before anything runs; its checkpoints as Orbax counts them; its
compilation cache; ``ici``: its ICI axes on the slice's devices, taken
from the topology where the user set none), and whether it fits its TPUs
(``memory``: each chip's HBM estimated in an instant; ``fit``: the static
checks, the AOT compile, the search for the smallest change that fits and
for the smallest shape of the generation that does), and how often it saves
(``save_period``: the optimum checkpoint period and what a loss or a
notice costs at it, pure arithmetic; ``save_plan``: the job's period
chosen from its times, measured or estimated, and put on its command
line).

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access`` and
``playbooks.cloud``.
"""
