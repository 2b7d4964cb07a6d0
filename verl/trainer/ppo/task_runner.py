"""Wire a resolved config into a running trainer: plan, Ray, tokenizer, data, rewards, workers, fit.

`run_ppo(config)` is what `python -m verl.trainer.main_ppo` calls after the config checks. The trainer
runs in this (driver) process; workers are Ray actors, one process per device, or per CPU worker when
the compat plan says CPU.
"""
from __future__ import annotations

import copy
import os
import signal
import threading
from contextlib import contextmanager

from omegaconf import OmegaConf

from verl.utils.startup.clock import Laps, startup_clock

# Environment every Ray worker starts with (upstream sets the same ones).
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
}

RAY_INIT_TIMEOUT_S = float(os.environ.get("VERL_RAY_INIT_TIMEOUT_S", "180"))


def run_ppo(config) -> None:
    """Check every input, start Ray while a thread imports the worker classes, start the worker
    processes, train; the output folder is locked to this run throughout (see `_output_lock`).

    Before Ray starts, a thread makes the plan (importing torch, reading the device) and then, on its
    own copy of the config resolved by the plan, loads the tokenizer and the reward function and reads
    and checks the data sets (one import at a time, never two). Any problem with the inputs, or a plan
    that cannot work (a simulated GPU on a GPU-less host, compat.strict), stops the run there, with
    `InputError` listing every input problem at once; no Ray process has started. Ray's start (mostly
    waiting for its daemons) then overlaps the import of the worker classes.
    """
    import ray

    from verl.trainer.preflight import InputError, input_problems

    clock = startup_clock()
    with _output_lock(config):
        problems = input_problems(config)  # from the config and file metadata alone
        own = copy.deepcopy(config)
        planning = _Background(_plan_for, own)
        inputs = _Background(build_inputs, own, after=planning)
        try:
            plan = planning.result()
        except Exception:  # noqa: BLE001 - e.g. no model config to plan with: the problems say why
            if problems:
                raise InputError(problems) from None
            raise
        clock.mark("plan")
        _apply_plan(config, plan)
        ready = inputs.result()  # every input check has passed (else InputError): only now does Ray start
        clock.mark("inputs")
        for stage, seconds in ready["seconds"].items():
            clock.record(stage, seconds)
        layout = _Background(lambda: worker_layout(own, plan))
        started_ray = False
        try:
            if not ray.is_initialized():
                _init_ray(config)
                started_ray = True
                stop_on_sigterm()  # ray.init installs a SIGTERM handler of its own in the driver
                clock.mark("ray_init")
            roles, pools = layout.result()
            clock.mark("wait_for_imports")
            clock.record("imports", layout.seconds)
            from verl.trainer.ppo.ray_trainer import spawn_worker_groups

            groups = spawn_worker_groups(config, roles, pools, plan)
            clock.mark("spawn_workers")
            trainer = build_trainer(config, plan, inputs=ready, layout=(roles, pools), worker_groups=groups)
            clock.mark("dataloaders")
            trainer.init_workers()
            print(trainer.actor_rollout_wg.describe_placement(), flush=True)
            trainer.fit()
        finally:
            if started_ray:
                ray.shutdown()
                _let_reaper_go()


@contextmanager
def _output_lock(config):
    """Hold `trainer.default_local_dir` for this run (see `verl.utils.checkpoint.run_lock`); another live
    run there is an `InputError` naming it. A run that neither saves checkpoints nor resumes from the folder
    (save_freq <= 0, resume_mode=disable) never touches it, so it takes no lock and can run beside others."""
    from verl.trainer.preflight import InputError
    from verl.utils.checkpoint.run_lock import RunLock, RunLockError

    folder = config.trainer.get("default_local_dir")
    saves = (config.trainer.get("save_freq") or -1) > 0
    resumes = str(config.trainer.get("resume_mode", "auto")) != "disable"
    if not folder or not (saves or resumes):
        yield
        return
    lock = RunLock(folder)
    try:
        lock.acquire()
    except RunLockError as err:
        raise InputError([str(err)]) from None
    try:
        yield
    finally:
        lock.release()


def _plan_for(config):
    """The compat plan for `config`, with `config` resolved by it (the start-up thread's own copy)."""
    from verl import compat

    plan = compat.build_plan(config)
    _resolve_by(config, plan)
    return plan


def _apply_plan(config, plan) -> None:
    """Print the plan and resolve the main thread's config by it, as the start-up thread resolved its copy."""
    from verl import compat

    print(compat.format_plan(plan), flush=True)
    _resolve_by(config, plan)


def _resolve_by(config, plan) -> None:
    """Fill the config's `auto` values from the plan, then every interpolation."""
    from verl import compat

    compat.resolve_config(config, plan)
    OmegaConf.resolve(config)


class _Background:
    """`fn(*args)` on a daemon thread (a Ctrl-C in the main thread need not wait for it), once `after` (another
    _Background) has finished, if given; `result()` waits and re-raises what it (or `after`) raised;
    `seconds` is how long `fn` itself ran."""

    def __init__(self, fn, *args, after: _Background | None = None):
        self._value = self._error = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn, args, after), name="verl-start-up", daemon=True)
        self._thread.start()

    def _run(self, fn, args, after) -> None:
        import time

        try:
            if after is not None:
                after.result()
            start = time.perf_counter()
            self._value = fn(*args)
            self.seconds = time.perf_counter() - start
        except BaseException as err:  # noqa: BLE001 - handed to the main thread by result()
            self._error = err

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into the same unwinding as Ctrl-C (so `finally` blocks close loggers and Ray)."""

    signum = signal.SIGTERM


def stop_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C in the main thread (elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def raise_interrupted(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, raise_interrupted)


def interruption_line(config, signum: int = signal.SIGINT) -> str:
    """One line: what stopped the run, the last complete checkpoint (or none), how to resume."""
    from verl.utils.checkpoint.checkpoint_manager import CheckpointTrackerError, find_latest_ckpt_path

    trainer = config.trainer
    cause = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    folder = None
    if trainer.get("default_local_dir"):
        try:
            # sizes only: a stop should not wait for a read of the whole checkpoint
            folder = find_latest_ckpt_path(os.path.abspath(trainer.default_local_dir), checksums=False)
        except CheckpointTrackerError:
            folder = None
    if folder is None:
        hint = ("set trainer.save_freq=N to save every N steps" if (trainer.get("save_freq") or -1) <= 0
                else "the same command starts from scratch")
        return f"stopped by {cause}; no complete checkpoint was saved ({hint})."
    if trainer.get("resume_mode", "auto") == "auto":
        how = "run the same command again to resume from it (trainer.resume_mode=auto)"
    else:
        how = f"resume with trainer.resume_mode=resume_path trainer.resume_from_path={folder}"
    return f"stopped by {cause}; last complete checkpoint: {folder}; {how}."


# Ray starts idle worker processes for a new job's first tasks. Every worker of ours is an actor with
# environment variables of its own (RANK, MASTER_PORT, ...), which an idle worker cannot take on, so those
# processes would only compete with start-up for the CPU.
NO_PRESTART = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


def _init_ray(config) -> None:
    """ray.init with ray_kwargs.ray_init, worker env vars, a CPU slot per worker and a time limit.

    It needs no plan: the plan is made beside it. Call it on the main thread: some of Ray's daemons (log
    monitor, dashboard, runtime-env agent) end with the thread that started them, which breaks the
    cluster once a short-lived thread exits, and the time limit is a signal.

    With RAY_ADDRESS set (or `+ray_kwargs.ray_init.address=...`), or a cluster that `ray start` recorded
    on this machine, the driver attaches to that running cluster instead of starting a local one, as
    upstream; the cluster's nodes then bring their own resources, so no CPU count or system config is
    passed (Ray refuses them when attaching). With none of those, `address="local"` says so to Ray, which
    otherwise looks for a running cluster by scanning every process on the host.
    """
    import ray

    from verl.utils.startup.bytecode_cache import worker_env

    init_kwargs = OmegaConf.select(config, "ray_kwargs.ray_init", default=None)
    init_kwargs = OmegaConf.to_container(init_kwargs, resolve=True) if init_kwargs is not None else {}
    runtime_env = {k: v for k, v in (init_kwargs.pop("runtime_env", None) or {}).items() if v is not None}
    runtime_env["env_vars"] = {**WORKER_ENV, **worker_env(), **(runtime_env.get("env_vars") or {})}
    init_kwargs = {k: v for k, v in init_kwargs.items() if v is not None}
    init_kwargs["runtime_env"] = runtime_env
    attach_to = (init_kwargs.get("address") or os.environ.get("RAY_ADDRESS")
                 or _recorded_cluster(init_kwargs.get("_temp_dir")))
    if attach_to == "local":
        attach_to = None
    if attach_to is None:
        init_kwargs["address"] = "local"
        if "num_cpus" not in init_kwargs:
            # Every worker's bundle takes one CPU slot: at least as many slots as workers, even on a machine
            # with fewer cores (CPU workers then share cores, slow but correct).
            n_workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
            init_kwargs["num_cpus"] = max(os.cpu_count() or 1, n_workers)
        init_kwargs["_system_config"] = {**NO_PRESTART, **(init_kwargs.get("_system_config") or {})}
    print(f"ray.init({init_kwargs})", flush=True)

    with _time_limit(RAY_INIT_TIMEOUT_S, "ray.init did not finish within {:.0f}s. Check `ray status` and stale Ray "
                     "processes (`ray stop`), or raise the limit with VERL_RAY_INIT_TIMEOUT_S."):
        ray.init(**init_kwargs)
    if attach_to is not None:
        print(f"Attached to the Ray cluster at {attach_to}: {describe_nodes()}", flush=True)
    else:
        _start_reaper()


_REAPER = []  # the write end of the running reaper's pipe, while this driver's local Ray instance runs


def _start_reaper() -> None:
    """Have the local Ray instance's leftovers ended once this driver is gone (see `ray_reaper`)."""
    import ray

    from verl.trainer.ppo import ray_reaper

    node = ray._private.worker._global_node
    if node is not None:
        _REAPER.append(ray_reaper.start(node.get_session_dir_path()))


def _let_reaper_go() -> None:
    """After ray.shutdown: the reaper ends whatever of the instance is still running, then exits."""
    while _REAPER:
        _REAPER.pop().close()


def _recorded_cluster(temp_dir: str | None) -> str | None:
    """The address `ray start` recorded for this machine's running cluster, if any (what Ray attaches to
    when ray.init gets no address)."""
    from ray._private.utils import read_ray_address

    return read_ray_address(temp_dir) or None


def describe_nodes() -> str:
    """One line per alive node of the Ray cluster: id, address and the CPU/GPU it advertises."""
    import ray

    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))
    parts = [f"node {n['NodeID'][:12]} ({n['NodeManagerAddress']}) CPU {n['Resources'].get('CPU', 0):g} "
             f"GPU {n['Resources'].get('GPU', 0):g}" for n in nodes]
    return f"{len(nodes)} node(s): " + "; ".join(parts)


@contextmanager
def _time_limit(seconds: float, message: str):
    """Raise TimeoutError if the block runs longer than `seconds` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(message.format(seconds))

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def worker_layout(config, plan):
    """The worker classes per role (actor+rollout, +ref when a KL term needs the reference policy,
    critic for GAE, the reward model when the plan has one) and the resource pool they share:
    (role_worker_mapping, resource_pool_manager)."""
    import ray

    import verl.trainer.ppo.ray_trainer  # noqa: F401 - the trainer the main thread builds next, imported here with the rest
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    actor_role = Role.ActorRolloutRef if need_reference_policy(config) else Role.ActorRollout
    role_worker_mapping = {actor_role: ray.remote(ActorRolloutRefWorker)}
    if need_critic(config):
        role_worker_mapping[Role.Critic] = ray.remote(CriticWorker)
    if plan.reward_model is not None:
        from verl.workers.reward_model.worker import RewardModelWorker

        role_worker_mapping[Role.RewardModel] = ray.remote(RewardModelWorker)
    pool = "global_pool"
    resource_pool_manager = ResourcePoolManager(
        resource_pool_spec={pool: [config.trainer.n_gpus_per_node] * config.trainer.nnodes},
        mapping={role: pool for role in role_worker_mapping},
        use_gpu=plan.device_type != "cpu",
        max_colocate_count=1,   # one process per device holds every role (create_colocated_worker_cls)
    )
    return role_worker_mapping, resource_pool_manager


def build_inputs(config) -> dict:
    """Tokenizer, reward managers, checked train/val sets and the sampler: everything the trainer
    needs from the config and the data (no Ray). "seconds" holds how long each piece took."""
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.trainer.preflight import InputError, input_problems, scorer_problems
    from verl.utils.dataset.rl_dataset import create_rl_sampler
    from verl.workers.model_building.loading import load_processor, load_tokenizer

    lap = Laps()
    model_cfg = config.actor_rollout_ref.model
    problems = []
    key = "tokenizer_path" if model_cfg.get("tokenizer_path") else "path"
    tokenizer = reward_fn = val_reward_fn = None
    try:
        tokenizer = load_tokenizer(model_cfg.get("tokenizer_path") or model_cfg.path,
                                   trust_remote_code=model_cfg.get("trust_remote_code", False))
    except Exception as err:  # noqa: BLE001 - whatever transformers raises, the user's fix is this key
        problems.append(f"actor_rollout_ref.model.{key}={model_cfg.get(key)}: the tokenizer does not load "
                        f"({type(err).__name__}: {_first_line(err)})")
    processor = None
    if tokenizer is not None:
        try:
            processor = load_processor(model_cfg.path, trust_remote_code=model_cfg.get("trust_remote_code", False))
        except (ValueError, NotImplementedError) as err:
            problems.append(f"actor_rollout_ref.model.path={model_cfg.path}: {err}")
    lap("tokenizer")
    reward_kwargs = OmegaConf.select(config, "reward_model.reward_kwargs", default=None) or {}
    reward_kwargs = OmegaConf.to_container(reward_kwargs, resolve=True) if OmegaConf.is_config(reward_kwargs) else dict(reward_kwargs)
    try:
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **reward_kwargs)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, **reward_kwargs)
    except (OSError, ImportError, AttributeError, TypeError, ValueError, RuntimeError) as err:
        problems.append(str(err))  # reward.py's messages name the key and the file
    lap("reward")
    if problems:
        raise InputError(input_problems(config) + problems)
    train_dataset, val_dataset = _checked_datasets(config, tokenizer, processor)
    problems = scorer_problems(config, {"data.train_files": train_dataset, "data.val_files": val_dataset})
    if problems:
        raise InputError(problems)
    train_sampler = create_rl_sampler(config.data, train_dataset)
    lap("datasets")
    return {"tokenizer": tokenizer, "processor": processor, "reward_fn": reward_fn, "val_reward_fn": val_reward_fn,
            "train_dataset": train_dataset, "val_dataset": val_dataset, "train_sampler": train_sampler,
            "seconds": lap.seconds}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


def build_trainer(config, plan, inputs: dict | None = None, layout=None, worker_groups=None):
    """The `RayPPOTrainer` for `config`; `inputs` (build_inputs), `layout` (worker_layout) and already
    started `worker_groups` (spawn_worker_groups) are made here when not given."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.preflight import InputError
    from verl.utils.dataset.rl_dataset import collate_fn

    roles, pools = layout or worker_layout(config, plan)
    inputs = inputs or build_inputs(config)
    try:
        return RayPPOTrainer(
            config=config,
            tokenizer=inputs["tokenizer"],
            processor=inputs.get("processor"),
            role_worker_mapping=roles,
            resource_pool_manager=pools,
            reward_fn=inputs["reward_fn"],
            val_reward_fn=inputs["val_reward_fn"],
            train_dataset=inputs["train_dataset"],
            val_dataset=inputs["val_dataset"],
            collate_fn=collate_fn,
            train_sampler=inputs["train_sampler"],
            plan=plan,
            worker_groups=worker_groups,
        )
    except ValueError as err:  # batch size vs data set size, and the like
        raise InputError([str(err)]) from err


def _checked_datasets(config, tokenizer, processor=None):
    """The train and validation sets; every problem with them (and with the logger) in one InputError."""
    from verl.trainer.preflight import InputError, input_problems
    from verl.utils.dataset.rl_dataset import create_rl_dataset

    data = config.data
    problems = input_problems(config)
    datasets = {}
    if not any(p.startswith("data.") for p in problems):
        for key, is_train in (("train_files", True), ("val_files", False)):
            limit = data.get("train_max_samples" if is_train else "val_max_samples", -1)
            try:
                dataset = create_rl_dataset(data[key], data, tokenizer, processor, is_train=is_train, max_samples=limit)
                if hasattr(dataset, "check_prompt_lengths"):  # a custom data.custom_cls need not have it
                    dataset.check_prompt_lengths()
            except (ValueError, KeyError, TypeError, OSError, NotImplementedError) as err:
                problems.append(f"data.{key}: {err.args[0] if err.args else err}")
                continue
            if len(dataset) == 0:
                problems.append(f"data.{key}: the data set is empty ({data[key]}"
                                + (", after dropping prompts over data.max_prompt_length)"
                                   if data.get("filter_overlong_prompts", True) else ")"))
            datasets[key] = dataset
    if problems:
        raise InputError(problems)
    return datasets["train_files"], datasets["val_files"]
