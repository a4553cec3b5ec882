# SPDX-License-Identifier: MIT
"""dormant and NCCL: a sleeping trainer gives back its communicators' memory.

By default (mode "auto", $DORMANT_NCCL, Manager(nccl=...)) every dormant
Manager suspends every NCCL communicator of the process after a sleep's
copies and resumes them before a wake's rebuild callbacks: every process
group c10d knows, Megatron's included, found in torch.distributed's own
registry (nothing to register). It needs NCCL 2.29.7 or later with cuMem
(the default; NCCL_CUMEM_ENABLE=0 leaves nothing to release); elsewhere
GET /stats says "unavailable" and why, once in the log too. Suspend and
resume are collective: every rank of a group must sleep and wake together
(dormant.client.Client.sleep_together); a call that waits for its peers past
nccl_timeout_s ($DORMANT_NCCL_TIMEOUT_S, 120 s) fails the transition with an
error naming the communicator, and the rank stays usable.

Mode "rebuild" is the fallback where suspend cannot work: the process groups
(all but WORLD) are destroyed after the copies and made again before the
rebuilds, the program's references rebound to the new ones. Mode "off"
leaves the communicators alone. docs/pytorch.md, "NCCL memory", has the
figures.

release_on_sleep(group) is the older, per-group opt-in (ReleasedGroup).

lean_one_rank_groups(max_ctas=1) ($DORMANT_NCCL_ONE_RANK_CTAS) makes every
later one-rank NCCL group with one CTA: about 384 MiB less per communicator
on the device, less for a suspend or a residue checkpoint to copy.
"""
from ._calls import CommTimeout
from ._comms import DEFAULT_TIMEOUT_S, MODES, Communicators
from ._group import ReleasedGroup, release_on_sleep
from ._lean import lean_from_env, lean_one_rank_groups
from ._libnccl import LibNccl, NcclError

__all__ = ["Communicators", "CommTimeout", "DEFAULT_TIMEOUT_S", "LibNccl", "MODES",
           "NcclError", "ReleasedGroup", "lean_from_env", "lean_one_rank_groups",
           "release_on_sleep"]
