"""Transport for a job of N cooperating processes under ``torchrun`` (torch.distributed).

``torchrun --nproc_per_node N -m reservoir extract ...`` starts N copies of a
command; :func:`launch` sees ``WORLD_SIZE > 1`` and joins them in one process
group (each rank on ``cuda:LOCAL_RANK``, or on the CPU) and yields the rank's
:class:`Job`; a process alone gets :data:`LOCAL`. A job gives:

- the rank's identity (``rank``, ``world``, ``local_rank``, ``device``);
- collectives that every rank ends with success or failure
  (:meth:`Job.sync`, and :meth:`Job.share` for rank 0's small result): a
  failed or timed-out one (``RESERVOIR_DIST_TIMEOUT`` seconds, default 1800)
  ends the rank with one line naming the ranks that failed or never arrived;
- dealing work units (:meth:`Job.deal`: every ``world``-th, none on two ranks);
- one progress count over all ranks (:meth:`Job.count`, :meth:`Job.bar`).

The ranks exchange only control messages (CPU tensors, through gloo; NCCL is
the group's CUDA backend). This package knows nothing of tasks, stores or
extraction: the sharded extraction's protocol is :mod:`reservoir.extract.sharded`.
"""

from reservoir.distributed.group import launch, rank_device, sharding
from reservoir.distributed.jobs import (DEFAULT_TIMEOUT, ENV_TIMEOUT, LOCAL, Job, Local, Lost, Progress, attempt,
                                        gloo_cause, is_leader, world_size)

__all__ = ["DEFAULT_TIMEOUT", "ENV_TIMEOUT", "LOCAL", "Job", "Local", "Lost", "Progress", "attempt", "gloo_cause",
           "is_leader", "launch", "rank_device", "sharding", "world_size"]
