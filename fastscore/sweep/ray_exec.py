"""Shards on Ray: one actor per worker, each keeping its model loaded across the shards it is given.

A worker that dies mid-shard (killed, out of memory, node lost) is replaced and its shard redone from that shard's
`.partial` folder; an error raised inside a shard stops the sweep with a one-line message naming the shard.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Sequence

from fastscore.deps import require
from fastscore.errors import SweepError
from fastscore.sweep.grid import Shard
from fastscore.sweep.worker import ShardDone, ShardRunner, ShardSettings

log = logging.getLogger(__name__)

# Environment a worker needs to find the same cache and data as the driver on a local instance.
FORWARDED_ENV = ("FASTSCORE_HOME", "FASTSCORE_DATA")
MAX_WORKER_DEATHS = 3  # per shard, before the sweep gives up on it


def require_ray():
    return require("ray", "ray")


class ShardActor:
    """The Ray actor's body (decorated at run time, so importing this module does not import Ray)."""

    def __init__(self, settings: ShardSettings) -> None:
        self.runner = ShardRunner(settings)

    def run(self, shard: Shard) -> ShardDone:
        return self.runner.run(shard)

    def pid(self) -> int:
        return os.getpid()


def _connect(ray, address: str, cpus: int) -> bool:
    """Start a Ray instance for the run ("local") or join a cluster; True when this call started Ray."""
    if ray.is_initialized():
        return False
    env_vars = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    common = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
              "runtime_env": {"env_vars": env_vars} if env_vars else None}
    if address == "local":
        ray.init(num_cpus=cpus, **common)
    else:
        ray.init(address=address, **common)
    return True


def run_on_ray(shards: Sequence[Shard], settings: ShardSettings, address: str, workers: int, cpus_per_worker: int,
               on_done: Callable[[ShardDone], None]) -> None:
    ray = require_ray()
    started_here = _connect(ray, address, workers * cpus_per_worker)
    try:
        actor_class = ray.remote(num_cpus=cpus_per_worker, max_restarts=0)(ShardActor)
        _drive(ray, actor_class, list(shards), settings, min(workers, len(shards)) or 1, on_done)
    finally:
        if started_here:
            ray.shutdown()


def _next_shard(queue: deque[Shard], last_model: tuple | None) -> Shard:
    """The first queued shard of the worker's loaded model and variant, else the oldest one."""
    for i, shard in enumerate(queue):
        if (shard.cell.model, shard.cell.variant) == last_model:
            del queue[i]
            return shard
    return queue.popleft()


def _drive(ray, actor_class, shards: list[Shard], settings: ShardSettings, workers: int,
           on_done: Callable[[ShardDone], None]) -> None:
    queue = deque(shards)
    idle = [(actor_class.remote(settings), None) for _ in range(workers)]
    inflight: dict = {}  # ObjectRef -> (actor, shard)
    deaths: Counter[str] = Counter()
    while queue or inflight:
        while idle and queue:
            actor, last_model = idle.pop()
            shard = _next_shard(queue, last_model)
            inflight[actor.run.remote(shard)] = (actor, shard)
        (ref,), _ = ray.wait(list(inflight), num_returns=1)
        actor, shard = inflight.pop(ref)
        try:
            done = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the worker process is gone: replace it, redo the shard
            deaths[shard.key] += 1
            if deaths[shard.key] >= MAX_WORKER_DEATHS:
                raise SweepError(f"shard {shard.key}: its worker died {deaths[shard.key]} times "
                                 f"({_first_line(exc)})") from None
            log.warning("shard %s: worker died (%s); redoing it on a new worker", shard.key, _first_line(exc))
            queue.appendleft(shard)
            idle.append((actor_class.remote(settings), None))
            continue
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise SweepError(f"shard {shard.key} failed on a Ray worker: {type(cause).__name__}: "
                             f"{_first_line(cause)}") from None
        idle.append((actor, (shard.cell.model, shard.cell.variant)))
        on_done(done)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
