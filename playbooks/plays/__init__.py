"""The plays: each module makes the steps of one part of the tutorial (or of
one task), pure functions of the environment that return steps. A play
never imports another play.

In the tutorial's order: ``capacity`` (the read-only checks and the plan per
slice), ``prereqs`` (§1: APIs, roles), ``network`` (§2), ``cluster`` (§3),
``nodepools`` (§4), ``storage`` (§5: bucket, identity), ``raycluster`` (§7),
``dashboard`` (the port-forward and the Ray nodes), ``preflight`` (the fit
before a job), ``train`` (§8-9: the job, followed), ``chaos`` (§9: a host killed,
given a notice, frozen, made sick, its maintenance scheduled, on GKE or the
twin: one play over each target's way),
``teardown`` (§10), ``stop_tpus`` (the TPUs' bill stopped, the rest
kept). Also: ``logs`` (logs, metrics and
goodput of a run), ``local_cluster`` (the local twin started, stopped and
checked), ``controller`` (the files synced to a controller host),
``quarantine`` (a host set aside and given back), ``slice_notice`` (a
slice's announced end: what is coming, the notice before it, its
maintenance started) and ``watch`` (one job followed by the watch that
acts: what `train` runs on the Ray head).

May import ``playbooks.core``, ``playbooks.config``, ``playbooks.access``,
``playbooks.cloud``, ``playbooks.job``, ``playbooks.runs`` and
``playbooks.twin``.
"""
