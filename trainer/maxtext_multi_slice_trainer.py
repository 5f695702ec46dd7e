"""MaxText pre-training across TPU slices with Ray Train's JaxTrainer.

    python maxtext_multi_slice_trainer.py base.yml key=value ...

Ray reserves every slice at once (a SlicePlacementGroup), one worker per TPU
host: ScalingConfig(use_tpu=True, num_workers=slices x hosts per slice,
topology, accelerator_type="TPU-V6E", resources_per_worker={"TPU": chips per
host}, placement_strategy="SPREAD"). Each worker runs MaxText's pre-training
main with these arguments. The layout comes from the job's environment
(TRAINER_*), by default the tutorial's 2 x v6e-16 (see maxtext_ray.py).
"""
from absl import app

import maxtext_ray


def main(argv):
    maxtext_ray.fit(argv, elastic=False)


if __name__ == "__main__":
    app.run(main)
