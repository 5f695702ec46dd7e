"""MaxText pre-training across TPU slices with Ray Train's JaxTrainer.

    python maxtext_multi_slice_trainer.py base.yml key=value ...

Ray reserves every slice at once (a SlicePlacementGroup), one worker per TPU
host; each worker runs MaxText's pre-training main with these arguments.
"""
import os
import sys

from absl import app

import maxtext_ray as mr


def train_loop_per_worker(config):
    import ray.train

    import maxtext_ray

    maxtext_ray.run_maxtext(config["argv"], config["layout"], ray.train.get_context().get_world_size())


def main(argv):
    import ray
    from ray.train.v2.api.config import RunConfig
    from ray.train.v2.jax import JaxTrainer

    argv = mr.absolute_config(argv)
    mr.check_model_config(argv)
    layout = mr.Layout.from_env()
    trainer = JaxTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={"argv": argv, "layout": layout},
        scaling_config=mr.scaling_config(layout, elastic=False),
        run_config=RunConfig(
            name="maxtext_jaxtrainer",
            storage_path=os.environ.get(mr.ENV_STORAGE_PATH),
            worker_runtime_env=mr.worker_runtime_env(),
        ),
    )
    trainer.fit()
    print("Training complete!", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    app.run(main)
