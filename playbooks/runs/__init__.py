"""A run after its submit: following its job (``follow``: the log, the
watch beside it), the run's event vocabulary (``events``: each kind named
once, the sets the readers share), the run's timeline of events
(``timeline``), a job's log lines as the console shows them (``job_log``),
the streaming CLI's own dying traceback told from the job's lines
(``cli_traceback``),
what the RayCluster's pods say of a followed job (``pod_watch``), when a job is
stalled (``stall``), a stalled job's hang named by its evidence (``hang_diagnosis``: the
culprit host and cause from the workers' stacks and heartbeats; ``hang_evidence``: gathering and
keeping them), the summary of its steps (``train_summary``), where each
second went (``goodput``, and the field's library on the same run,
``goodput_reference``), every save due and whether it was finalized
(``saves``), what it cost in chip-hours and dollars, and the
estimate before a submit (``cost``), a save's and a step's seconds as the
environment's runs measured them (``save_times``), the list of an environment's runs
(``run_list``), its kept step metrics and their plot (``metrics``), where each
rank of a running job sits (``placement``), what a chaos task's
``--target`` aims at (``chaos_target``), the hosts an environment has set
aside (``quarantine_record``) and which host the follow sets aside by
itself, or whether it stops the job instead (``restart``: stall_action:
restart, a failed health gate), and the watch's own Ray job beside each
job, that acts with nobody following (``cluster_watch``), and what that
watch in a GKE head pod records, taken back from its log
(``watch_records``), and which slices that watch gives notice of before
their maintenance or flex-start end (``maintenance_watch``).

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access``,
``playbooks.cloud`` and ``playbooks.job``.
"""
