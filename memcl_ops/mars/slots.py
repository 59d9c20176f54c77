"""MARS's slot memory as the memory manager keeps it: the router, SGSE's expansions applied under the slot cap
(`sgse.max_slots`, docs/methods.md "SGSE"), and the history of both."""

from __future__ import annotations

import json

import numpy as np
import torch

from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.mars.sgse import Expansion
from memcl_ops.tensors import prefixed, state_part


class SlotMemory:
    def __init__(self, feature_dim: int, config: RouterConfig, max_slots: int, seed: int):
        self.router = SlotRouter(feature_dim, config, seed=seed)
        self.max_slots = max_slots
        self.routed = 0  # samples routed so far (the x axis of the slot history)
        self.slot_history: list[tuple[int, int]] = [(0, self.router.num_slots)]
        self.expansions: list[dict] = []
        self.refused_expansions = 0  # expansions SGSE asked for once the cap was reached

    @property
    def num_slots(self) -> int:
        return self.router.num_slots

    def to(self, device: torch.device | str) -> SlotMemory:
        """Route (and train the router) on `device`; the state stays plain numpy wherever the router lives."""
        self.router.to(device)
        return self

    @torch.no_grad()
    def route(self, h: torch.Tensor) -> torch.Tensor:
        """Routing probabilities per sample; the batch is folded into the anchor statistics."""
        probs = self.router.route(h)
        self.router.update_anchor_stats(h, probs)
        self.routed += h.shape[0]
        return probs

    @torch.no_grad()
    def expand(self, expansions: list[Expansion]) -> int:
        """Add a slot per expansion while under the cap (key Norm(W_q centre)); returns the slot count."""
        for e in expansions:
            if self.router.num_slots >= self.max_slots:
                self.refused_expansions += 1
                continue
            device = self.router.keys.device
            # add_slot builds the new slot's rows on the CPU (memcl_ops/mars/router.py takes no device): grow the
            # router there and move it back; a slot is a few KiB and expansions are rare.
            self.router.cpu()
            self.router.add_slot(self.router.query(torch.from_numpy(np.asarray(e.centre)).reshape(1, -1)))
            self.router.to(device)
            self.expansions.append({"at_sample": self.routed, "test_step": e.step, "slots": self.router.num_slots,
                                    "successes": e.successes, "trials": e.trials,
                                    "lower_bound": float(e.lower_bound)})
            self.slot_history.append((self.routed, self.router.num_slots))
        return self.router.num_slots

    def load_trained(self, state: dict[str, np.ndarray]) -> None:
        """Take trained router parameters (stage 1); the slot count must not have changed meanwhile."""
        if state["keys"].shape[0] != self.router.num_slots:
            raise ValueError(f"trained memory has {state['keys'].shape[0]} slots, the memory {self.router.num_slots}")
        self.router.load_state(state)

    def nbytes(self) -> int:
        return self.router.nbytes()

    def history(self) -> dict:
        return {"slot_history": [list(p) for p in self.slot_history], "expansions": self.expansions,
                "refused_expansions": self.refused_expansions}

    def state(self) -> dict[str, np.ndarray]:
        out = prefixed("router", self.router.state())
        out["slot_history"] = np.array(self.slot_history, dtype=np.int64).reshape(-1, 2)
        out["expansions"] = np.array(json.dumps(self.expansions))
        out["counters"] = np.array([self.routed, self.refused_expansions], dtype=np.int64)
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.router.load_state(state_part(state, "router"))
        self.slot_history = [tuple(int(x) for x in row) for row in state["slot_history"]]
        self.expansions = json.loads(str(state["expansions"]))
        self.routed, self.refused_expansions = (int(x) for x in state["counters"])
