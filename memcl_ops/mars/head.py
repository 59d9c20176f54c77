"""DCDA stage 2's head: a growing linear classifier trained with CE + old-class distillation (LwF and
sequential fine-tuning are its special cases)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from memcl_ops.head_training import Stage2Config, Teacher, apply_memory, train_stage2
from memcl_ops.mars.dcda import ClassAnchors, ClassGaussians
from memcl_ops.mars.router import SlotRouter
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import array_bytes, take_rows


class DistillHead:
    """A growing linear head trained with CE + old-class distillation (DCDA stage 2, LwF, fine-tune).

    With λ_LwF = λ_anchor = λ_anchor_ce = λ_gaussian = 0 it is plain sequential fine-tuning and keeps no teacher.
    """

    def __init__(self, feature_dim: int, config: Stage2Config, seed: int):
        self.config, self.seed = config, seed
        self.head = GrowingLinearHead(feature_dim)
        self.teacher: Teacher | None = None
        self.fits = 0
        # the (slot, class) anchor sums, when the anchor terms (KD, CE) use them and there is a memory to route
        # through
        anchored = bool(config.lambda_anchor or config.lambda_anchor_ce)
        self.class_anchors = ClassAnchors(feature_dim) if config.anchor_points == "slot-class" and anchored else None
        self.gaussians = ClassGaussians(feature_dim, config.gaussian_rank) if config.lambda_gaussian else None
        self.device = torch.device("cpu")  # where its epochs run

    def to(self, device: torch.device) -> None:
        """Train on `device` (its state and predictions stay on the CPU)."""
        self.device = device

    @property
    def distills(self) -> bool:
        return bool(self.config.lambda_lwf or self.config.lambda_anchor or self.config.lambda_anchor_ce)

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: SlotRouter | None) -> dict[str, float]:
        with torch.no_grad():  # routed once for the anchors and stage 2
            routed = memory(features) if memory is not None else None
        if self.class_anchors is not None and memory is not None:
            self.class_anchors.add(memory, features, labels, routed)
        new_classes = self.head.grow(labels)
        history = train_stage2(self.head, memory, features, labels, self.teacher, self.config,
                               seed=self.seed * 100_003 + self.fits, routed=routed, new_classes=new_classes,
                               extra_loss=self._gaussian_replay(memory), device=self.device)
        if self.gaussians is not None:
            self.gaussians.add(features, labels)
        self.fits += 1
        return {"loss_first": history[0], "loss_last": history[-1]} if history else {}

    def _gaussian_replay(self, memory: SlotRouter | None):
        """CE on draws for the classes of earlier blocks, read through the memory like real rows (None while there
        is nothing to draw from)."""
        if self.gaussians is None:
            return None
        # its own stream, apart from the stage-2 loop's seeds (seed * 100_003 + fits)
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, self.fits, 1])
                                                      .generate_state(1)[0]))
        sampled = self.gaussians.sample(self.config.gaussian_per_class, self.config.gaussian_shrink, generator)
        if sampled is None:
            return None
        rows, classes = sampled
        with torch.no_grad():
            h_tilde = apply_memory(memory, rows).to(self.device)
        targets = self.head.columns(torch.from_numpy(classes)).to(h_tilde.device)
        k, weight = self.config.optim.batch_size, self.config.lambda_gaussian

        def replay(_idx: torch.Tensor) -> torch.Tensor:
            pick = torch.randint(len(h_tilde), (k,), generator=generator)
            return weight * F.cross_entropy(self.head(take_rows(h_tilde, pick)), targets[pick])
        return replay

    def end_task(self, memory: SlotRouter | None) -> None:
        if self.distills:
            points = (self.class_anchors.points(memory) if self.class_anchors is not None and memory is not None
                      else None)
            self.teacher = Teacher.snapshot(memory, self.head, points, self.config.teacher_bytes)

    def known_classes(self) -> np.ndarray:
        return np.asarray(self.head.classes, np.int64)

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: SlotRouter | None) -> np.ndarray:
        return self.head.predict(apply_memory(memory, features))

    @torch.no_grad()
    def scored(self, features: torch.Tensor, memory: SlotRouter | None) -> tuple[np.ndarray, np.ndarray]:
        return self.head.scored(apply_memory(memory, features))

    def state(self) -> dict[str, np.ndarray]:
        out = {f"head.{k}": v for k, v in self.head.state().items()}
        if self.teacher is not None:
            out.update({f"teacher.{k}": v for k, v in self.teacher.state().items()})
        if self.class_anchors is not None:
            out.update({f"class_anchors.{k}": v for k, v in self.class_anchors.state().items()})
        if self.gaussians is not None:
            out.update({f"gaussians.{k}": v for k, v in self.gaussians.state().items()})
        out["fits"] = np.array(self.fits)
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        teacher = {k[8:]: v for k, v in state.items() if k.startswith("teacher.")}
        self.teacher = Teacher.from_state(teacher) if teacher else None
        if self.class_anchors is not None:
            self.class_anchors.restore({k[14:]: v for k, v in state.items() if k.startswith("class_anchors.")})
        if self.gaussians is not None:
            self.gaussians.restore({k[10:]: v for k, v in state.items() if k.startswith("gaussians.")})
        self.fits = int(state["fits"])

    def memory_bytes(self) -> dict[str, int]:
        return {"head": self.head.nbytes(),
                "teacher": array_bytes(self.teacher.state()) if self.teacher is not None else 0,
                "class_anchors": array_bytes(self.class_anchors.state()) if self.class_anchors is not None else 0,
                "class_gaussians": array_bytes(self.gaussians.state()) if self.gaussians is not None else 0}
