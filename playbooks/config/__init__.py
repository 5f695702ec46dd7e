"""What the user asks for and the tutorial says, and where things live: the
inventory's keys and rules (``schema``), every path the project keeps
(``paths``), the project's root (``project``), the tutorial's values
(``tutorial``), the pinned versions (``versions``), the TPU generations,
one record each, and their topology arithmetic (``tpu``), the inventory's
other choices as records (the environment's kind, a cluster's mode, a
capacity option: ``choices``), a local cluster's port layout
(``local_ports``), the settings MaxText accepts (``maxtext_settings``), and
the command that gives a TPU host's Ray node its notice to go (``host_notice``),
and how long a Spot preemption gives the job's pods, lengthened where the
cluster takes it (``spot_grace``).

Pure knowledge: no process, no file of a run, no network. May import
``playbooks.core`` only.
"""
