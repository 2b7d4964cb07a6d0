"""SFT with its ranks as Ray workers: `python -m verl.trainer.sft_trainer_ray` (upstream 0.9.1's entry point).

The same trainer, keys and plan as `verl.trainer.sft_trainer`; instead of torchrun starting the ranks,
the driver starts Ray (`ray_kwargs.ray_init` when given) and one worker per device
(`trainer.n_gpus_per_node` x `trainer.nnodes`), each running one rank of the SFT loop; rank 0 logs.
"""
from __future__ import annotations

from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.trainer.sft_trainer import checked_plan, fit_rank


class SFTWorker(Worker):
    """One rank of the SFT loop."""

    def __init__(self, config, plan):
        super().__init__()
        self.config, self.plan = config, plan

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fit(self) -> dict[str, float]:
        """Train to the end; returns this rank's last-step metrics."""
        return fit_rank(self.config, self.plan, device_index=self.device_index)


def run_sft_ray(config) -> dict[str, float]:
    """Check, plan, start Ray and the ranks, train; returns rank 0's last-step metrics."""
    import ray

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.trainer.ppo.task_runner import _init_ray

    plan = checked_plan(config)
    _init_ray(config)
    try:
        pool = RayResourcePool([int(config.trainer.n_gpus_per_node)] * int(config.trainer.nnodes),
                               use_gpu=plan.device_type != "cpu", max_colocate_count=1)
        workers = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(SFTWorker), config=config, plan=plan))
        return workers.fit()[0]
    finally:
        ray.shutdown()


def main() -> None:
    import hydra

    hydra.main(config_path="config", config_name="sft_trainer_engine", version_base=None)(run_sft_ray)()


if __name__ == "__main__":
    main()
