"""Elastic MaxText pre-training: goes on with fewer TPU slices when one is
lost, and grows back when it returns.

    python maxtext_elastic_trainer.py base.yml key=value ...

num_workers is (hosts per slice, all hosts): one whole slice at least, every
slice at most. On a resize Ray Train restarts the workers, and MaxText
restores the latest checkpoint of the run, resharded to the new mesh.
"""
import os

from absl import app

import maxtext_ray as mr


def train_loop_per_worker(config):
    import ray.train

    import maxtext_ray

    maxtext_ray.run_maxtext(config["argv"], config["layout"], ray.train.get_context().get_world_size())


def main(argv):
    import ray
    from ray.train.v2.api.config import FailureConfig, RunConfig
    from ray.train.v2.jax import JaxTrainer

    argv = mr.absolute_config(argv)
    mr.check_model_config(argv)
    layout = mr.Layout.from_env()
    trainer = JaxTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={"argv": argv, "layout": layout},
        scaling_config=mr.scaling_config(layout, elastic=True),
        run_config=RunConfig(
            name="maxtext_jaxtrainer",
            storage_path=os.environ.get(mr.ENV_STORAGE_PATH),
            failure_config=FailureConfig(max_failures=3),
            worker_runtime_env=mr.worker_runtime_env(),
        ),
    )
    trainer.fit()
    print("Training complete!", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    app.run(main)
