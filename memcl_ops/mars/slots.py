"""MARS's slot memory as the memory manager keeps it: the router, SGSE's expansions applied under the slot cap
(`sgse.max_slots`, docs/methods.md "SGSE"), and the history of both."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.mars.sgse import Expansion
from memcl_ops.tensors import prefixed, resolve_device, state_part


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
        """Take the parameters stage 1 trained (W_q, and K, γ, β of the slots it was given); the anchor statistics
        and the slots SGSE added while it trained in the background stay as the stream left them."""
        trained = state["keys"].shape[0]
        if trained > self.router.num_slots:
            raise ValueError(f"trained memory has {trained} slots, the memory only {self.router.num_slots}")
        current = self.router.state()
        merged = {**current, "w_q": state["w_q"], "query_isometry": state["query_isometry"]}
        for name in ("keys", "gamma", "beta"):
            merged[name] = np.concatenate([state[name], current[name][trained:]])
        self.router.load_state(merged)

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


class SlotStore(SlotMemory):
    """The slot memory as a store of the memory manager (memcl_ops/roles/memory_manager.py): routes feature
    batches on `device` and keeps them for the trainers when asked (a compiled graph's batches never reach the
    driver)."""

    def __init__(self, feature_dim: int, config: RouterConfig, max_slots: int, seed: int, device: str = "cpu"):
        super().__init__(feature_dim, config, max_slots, seed)
        self.device = resolve_device(device)
        self.to(self.device)
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the round's feature batches (`keep`)

    def route_batch(self, batch: pa.RecordBatch | None, expansions: list[Expansion] | None = None,
                    keep: bool = False) -> pa.RecordBatch | None:
        """The routing confidence per sample (for SGSE); also folds the batch into the anchor statistics.
        `expansions` (the monitor's verdict on the previous batch) are applied first, which saves the stream a
        separate call per batch. None (every row refused at the gate) passes through. `keep`: also keep the batch
        for `take_block`."""
        if expansions:
            self.expand(expansions)
        if batch is None:
            return None
        if keep:  # copied: a compiled graph's input lives in a channel buffer that the next batch overwrites
            self.kept.append((S.sample_ids_to_numpy(batch).copy(), np.array(S.features_to_numpy(batch)),
                              S.labels_to_numpy(batch), S.task_ids_to_numpy(batch)))
        confidence = self.route(S.features_to_torch(batch).to(self.device)).max(dim=1).values.cpu().numpy()
        return pa.RecordBatch.from_arrays([batch.column(S.SAMPLE_ID), pa.array(confidence)],
                                          names=[S.SAMPLE_ID, "confidence"])

    def take_block(self) -> pa.RecordBatch | None:
        """The batches kept since the last take, as one feature batch in stream order (None: none kept): sample ids,
        features, labels (-1: none) and task ids (-1: none), what the trainers read (S.labelled_block), and each
        row's batch (S.STREAM_BATCH, where test-then-train cuts it); schema metadata is not kept."""
        kept, self.kept = self.kept, []
        if not kept:
            return None
        ids, feats, labels, tasks = (np.concatenate(part) for part in zip(*kept))
        block = S.feature_batch(ids, feats, labels, tasks)
        runs = np.concatenate([np.full(len(k[0]), i, np.int32) for i, k in enumerate(kept)])
        return block.append_column(S.STREAM_BATCH, pa.array(runs))

    def memory_state(self) -> dict[str, np.ndarray]:
        return self.router.state()

    def report(self) -> dict[str, int]:
        return {"slots": self.nbytes(), "num_slots": self.num_slots}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        super().restore(state)
        self.to(self.device)
