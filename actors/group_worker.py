"""What a data-parallel worker's actor adds to its role: where worker 0 of a group is reached."""

from __future__ import annotations

import ray

from memcl_ops.data_parallel import rendezvous_address


class GroupWorker:
    def rendezvous(self) -> str:
        """Where this actor, as worker 0 of a data-parallel group, is reached by the others: its node's address and a
        free port there."""
        return rendezvous_address(ray.util.get_node_ip_address())
