"""A run after its submit: following its job (``follow``: the log, the
watch beside it), the run's timeline of events (``timeline``), when a job is
stalled (``stall``), the summary of its steps (``train_summary``), where each
second went (``goodput``, and the field's library on the same run,
``goodput_reference``), its kept step metrics and their plot (``metrics``).

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access``,
``playbooks.cloud`` and ``playbooks.job``.
"""
