"""Sharded extraction: one extraction as N cooperating processes under ``torchrun`` (torch.distributed).

``torchrun --nproc_per_node N -m reservoir extract ...`` starts N copies of the
command; :func:`launch` sees ``WORLD_SIZE > 1`` and joins them in one process
group (each rank on ``cuda:LOCAL_RANK``, or on the CPU). The steps, each ended
by a collective in which every rank reports success or failure:

1. ``task``, ``prepare``: local rank 0 of every node builds the task (or loads
   it from the task cache) first, the node's other ranks then load it from the
   cache; every rank loads the backbone onto its device.
2. ``create``: rank 0 creates or reopens the store under its write lock (held
   until the job ends) and sends every rank the ``done`` flags it sees.
3. ``open``: the other ranks open the store for writing under rank 0's lock
   (:class:`reservoir.store.lock.SharedLock`), checking their settings.
4. ``written``: each rank writes its share of the unfinished work
   (:meth:`Job.deal`: no chunk on two ranks) and the ``done`` flags.
5. ``complete``: only if every rank wrote its share does rank 0 mark the store
   complete.

The ranks exchange only control messages (CPU tensors, through gloo; NCCL is
the group's CUDA backend). A failed or timed-out collective
(``RESERVOIR_DIST_TIMEOUT`` seconds, default 1800) ends the rank with one line
naming the ranks that did not arrive; finished chunks stay done, so the same
command, under any number of processes, resumes the store.
"""

from reservoir.distributed.group import launch, rank_device, write_sharded
from reservoir.distributed.jobs import DEFAULT_TIMEOUT, ENV_TIMEOUT, LOCAL, Job, Local, is_leader, world_size

__all__ = ["DEFAULT_TIMEOUT", "ENV_TIMEOUT", "LOCAL", "Job", "Local", "is_leader", "launch", "rank_device",
           "world_size", "write_sharded"]
