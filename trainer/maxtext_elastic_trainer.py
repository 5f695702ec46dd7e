"""Elastic MaxText pre-training: goes on with fewer TPU slices when one is
lost, and grows back when it returns.

    python maxtext_elastic_trainer.py base.yml key=value ...

The same JaxTrainer as maxtext_multi_slice_trainer.py, with num_workers =
(hosts per slice, all hosts) -- one whole slice at least, every slice at
most -- and at most N worker-group failures within W seconds, N and W the
inventory's max_failures and failure_window (TRAINER_MAX_FAILURES, 3;
TRAINER_FAILURE_WINDOW_S, 3600; W = 0: FailureConfig(max_failures=N) over
the job's life, as Ray Train counts; elastic_control.FailureBudget). On a
resize Ray Train restarts the workers and MaxText restores the run's latest
checkpoint, resharded to the new mesh.
"""
import elastic_control
from absl import app

import maxtext_ray


def main(argv):
    maxtext_ray.fit(argv, elastic=True, callbacks=tuple(elastic_control.callbacks()))


if __name__ == "__main__":
    app.run(main)
