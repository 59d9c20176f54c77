"""MARS slot-routed affine memory over frozen features (docs/methods.md, "MARS").

    q = W_q h_T,   p_i = softmax_i(<q̂, k̂_i> / τ_r),   s = max_i p_i
    h̃ = (Σ_i p_i γ_i) ⊙ LN(h_T) + Σ_i p_i β_i           (LN without affine: the slots provide it)

Each slot owns a key k_i, an affine (γ_i, β_i) initialised to the identity, and router-weighted EMA
anchor statistics (μ_i, c_i) from which its anchor a_i = γ_i ⊙ μ_i / max(c_i, ς) + β_i is read.

While W_q is an isometry (kept unless stage 1 trains it), <q̂, k̂_i> = <ĥ, W_qᵀ k̂_i>: the keys are taken into
feature space (S x Q x D) instead of every sample into query space (N x D x Q, the largest cost of routing at
D = 1280). A fixed isometry only rotates the keys, and keys drawn from an isotropic Gaussian are as random after a
rotation as before, so by default W_q is the identity (`RouterConfig.query_init`): no Q x D matrix is stored, sent
between actors or multiplied; stage 1, when it trains W_q, starts it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from memcl_ops.tensors import layer_norm, normalize


@dataclass(frozen=True)
class RouterConfig:
    initial_slots: int = 32  # S0 [S]
    temperature: float = 0.07  # τ_r [S]
    query_dim: int | None = None  # width of W_q's output; None: the feature dim [R]
    # W_q's start: the identity, kept implicit (no matrix) until stage 1 trains it, or a random matrix with
    # orthonormal columns [R]. A query_dim other than the feature dim always starts orthogonal. With query_dim >= the
    # feature dim either start routes by a cosine between h and random keys (see the module docstring).
    query_init: Literal["identity", "orthogonal"] = "identity"
    anchor_momentum: float = 0.99  # ρ of the anchor EMA [R]
    anchor_floor: float = 1e-6  # ς in μ / max(c, ς) [R]
    anchor_min_mass: float = 1e-3  # c_min: slots with less mass give no anchor [R]


@dataclass
class RouterOutput:
    h_tilde: torch.Tensor  # (N, D) slot-weighted affine of LN(h)
    probs: torch.Tensor  # (N, S) routing probabilities
    confidence: torch.Tensor  # (N,) top-slot probability s_t
    ln_h: torch.Tensor  # (N, D) LN(h), what the slot affines act on


class SlotRouter(nn.Module):
    """Cosine-softmax router over S slot keys with one affine adapter per slot."""

    def __init__(self, feature_dim: int, config: RouterConfig = RouterConfig(), *, seed: int = 0, init: bool = True):
        super().__init__()
        self.config = config
        self.feature_dim = feature_dim
        if config.query_init not in ("identity", "orthogonal"):
            raise ValueError(f"router.query_init must be 'identity' or 'orthogonal', got {config.query_init!r}")
        query_dim = config.query_dim or feature_dim
        # an empty W_q (0 rows) stands for the identity
        identity = config.query_init == "identity" and query_dim == feature_dim
        w_q = torch.empty(0 if identity else query_dim, feature_dim)
        keys = torch.empty(config.initial_slots, query_dim)
        if init:  # (the QR of the orthogonal init costs ~0.1 s at D = 1280: skipped by `from_state`)
            gen = torch.Generator().manual_seed(seed)
            if not identity:
                nn.init.orthogonal_(w_q, generator=gen)
            keys = normalize(torch.randn(config.initial_slots, query_dim, generator=gen))
        self.w_q = nn.Parameter(w_q)
        self.keys = nn.Parameter(keys)
        self.gamma = nn.Parameter(torch.ones(config.initial_slots, feature_dim))
        self.beta = nn.Parameter(torch.zeros(config.initial_slots, feature_dim))
        self.register_buffer("anchor_sum", torch.zeros(config.initial_slots, feature_dim))  # μ_i
        self.register_buffer("anchor_mass", torch.zeros(config.initial_slots))  # c_i
        # W_q's columns orthonormal: routing may take the keys into feature space (see the module docstring)
        self.register_buffer("query_isometry", torch.tensor(init and query_dim >= feature_dim))
        self._isometric = bool(self.query_isometry)  # read on every route: no device sync for the buffer
        self._identity = identity
        self._feature_keys: tuple | None = None  # (K, its version, W_q, its version, k̂ W_q): see `feature_keys`

    @classmethod
    def from_state(cls, feature_dim: int, config: RouterConfig, state: dict[str, np.ndarray]) -> SlotRouter:
        """A router holding `state` (what `state()` returned), without computing an initialisation first."""
        router = cls(feature_dim, config, init=False)
        router.load_state(state)
        return router

    @property
    def num_slots(self) -> int:
        return self.keys.shape[0]

    def memory_parameters(self, query: bool = True) -> list[nn.Parameter]:
        """What DCDA stage 1 trains: W_q, K, γ, β (without W_q when `query` is False)."""
        return [self.w_q, self.keys, self.gamma, self.beta] if query else [self.keys, self.gamma, self.beta]

    def query(self, h: torch.Tensor) -> torch.Tensor:
        return h if self._identity else h @ self.w_q.T

    def train_query(self) -> None:
        """W_q is about to be trained: an implicit identity becomes a matrix, and W_q stops being an isometry, so
        routing maps every sample to its query."""
        if self._identity:
            self.w_q = nn.Parameter(torch.eye(self.feature_dim, device=self.keys.device))
            self._identity = False
        self.query_isometry.fill_(False)
        self._isometric = False

    def route(self, h: torch.Tensor) -> torch.Tensor:
        """Routing probabilities (N, S) for features h of shape (N, D)."""
        if self._isometric:
            sims = normalize(h) @ self.feature_keys().T
        else:
            sims = normalize(self.query(h)) @ normalize(self.keys).T
        return torch.softmax(sims / self.config.temperature, dim=-1)

    def feature_keys(self) -> torch.Tensor:
        """k̂_i W_q (S, D): the keys in feature space (k̂_i themselves while W_q is the implicit identity). Outside
        autograd it is kept until K or W_q changes (a new tensor or an in-place update bumps its version), so a
        stream of batches between two consolidations maps the keys once."""
        if self._identity:
            return normalize(self.keys)
        if torch.is_grad_enabled():
            return normalize(self.keys) @ self.w_q
        cached = self._feature_keys
        if (cached is None or cached[0] is not self.keys or cached[1] != self.keys._version
                or cached[2] is not self.w_q or cached[3] != self.w_q._version or cached[4].device != self.keys.device):
            cached = self._feature_keys = (self.keys, self.keys._version, self.w_q, self.w_q._version,
                                           normalize(self.keys) @ self.w_q)
        return cached[4]

    def forward(self, h: torch.Tensor, ln_h: torch.Tensor | None = None) -> RouterOutput:
        """`ln_h`: LN(h) if the caller has it already (stage 1 computes it once per call)."""
        probs = self.route(h)
        ln_h = layer_norm(h) if ln_h is None else ln_h
        h_tilde = (probs @ self.gamma) * ln_h + probs @ self.beta
        return RouterOutput(h_tilde, probs, probs.max(dim=-1).values, ln_h)

    @torch.no_grad()
    def add_slot(self, init_key: torch.Tensor | np.ndarray) -> int:
        """Append a slot with key Norm(init_key), identity affine and empty anchor stats; returns its index.

        Parameters are replaced by larger ones, so an optimizer built before must be rebuilt.
        """
        key = normalize(torch.as_tensor(np.asarray(init_key), dtype=self.keys.dtype).reshape(1, -1))
        if key.shape[1] != self.keys.shape[1]:
            raise ValueError(f"slot key has width {key.shape[1]}, router queries have {self.keys.shape[1]}")
        d = self.feature_dim
        self.keys = nn.Parameter(torch.cat([self.keys.data, key]))
        self.gamma = nn.Parameter(torch.cat([self.gamma.data, torch.ones(1, d)]))
        self.beta = nn.Parameter(torch.cat([self.beta.data, torch.zeros(1, d)]))
        self.anchor_sum = torch.cat([self.anchor_sum, torch.zeros(1, d)])
        self.anchor_mass = torch.cat([self.anchor_mass, torch.zeros(1)])
        return self.num_slots - 1

    @torch.no_grad()
    def update_anchor_stats(self, h: torch.Tensor, probs: torch.Tensor | None = None) -> None:
        """Router-weighted EMA of LN(h) per slot (as reconstructed in docs/methods.md, "MARS"):
        μ_i ← ρ μ_i + (1-ρ) Σ_x p_i(x) LN(h(x)),  c_i ← ρ c_i + (1-ρ) Σ_x p_i(x).
        `probs`: the routing of h if the caller has it already."""
        rho = self.config.anchor_momentum
        if probs is None:
            probs = self.route(h)
        self.anchor_sum.mul_(rho).add_((1 - rho) * probs.T @ layer_norm(h))
        self.anchor_mass.mul_(rho).add_((1 - rho) * probs.sum(dim=0))

    def anchors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(anchor points a_i, slot indices) for slots whose mass c_i reaches c_min."""
        cfg = self.config
        live = torch.nonzero(self.anchor_mass >= cfg.anchor_min_mass).flatten()
        mean = self.anchor_sum[live] / self.anchor_mass[live].clamp_min(cfg.anchor_floor).unsqueeze(1)
        return self.gamma[live] * mean + self.beta[live], live

    def at_state(self, state: dict[str, np.ndarray]) -> SlotRouter:
        """A router of this one's width and config, restored to `state` (the memory as it stood then)."""
        return SlotRouter.from_state(self.feature_dim, self.config, state)

    @torch.no_grad()
    def drift_pairs(self, previous: dict[str, np.ndarray], features: torch.Tensor
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """How h̃ moved since the memory stood at `previous`: (h̃ then, h̃ now) of `features`, and of the slots'
        anchors (slot i's mean LN(h) then, through the old and the current affine of slot i)."""
        before = self.at_state(previous)
        old_anchors, live = before.anchors()
        live = live[live < self.num_slots]
        cfg = before.config
        mean = before.anchor_sum[live] / before.anchor_mass[live].clamp_min(cfg.anchor_floor)[:, None]
        return [(before(features).h_tilde, self(features).h_tilde),
                (old_anchors[:len(live)], self.gamma[live] * mean + self.beta[live])]

    def state(self) -> dict[str, np.ndarray]:
        """Plain numpy state (what travels between actors and into checkpoints)."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Exact inverse of `state`, including a different number of slots. A missing entry (a state written before
        it existed) raises KeyError naming it, as every other part's `restore` does."""
        missing = sorted(set(self.state_dict()) - set(state))
        if missing:
            raise KeyError(missing[0])
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        # Slots may have been added since construction, and W_q may be implicit on one side: resize before copying.
        if state_dict["w_q"].shape != self.w_q.shape:
            self.w_q = nn.Parameter(torch.zeros(state_dict["w_q"].shape))
        slots = state_dict["keys"].shape[0]
        if slots != self.num_slots:
            d, q = self.feature_dim, state_dict["keys"].shape[1]
            self.keys = nn.Parameter(torch.zeros(slots, q))
            self.gamma = nn.Parameter(torch.zeros(slots, d))
            self.beta = nn.Parameter(torch.zeros(slots, d))
            self.anchor_sum = torch.zeros(slots, d)
            self.anchor_mass = torch.zeros(slots)
        out = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._isometric = bool(self.query_isometry)
        self._identity = self.w_q.shape[0] == 0
        return out

    def nbytes(self) -> int:
        """Bytes of the arrays kept (the 0-d isometry flag is a setting, as memcl_ops/tensors.py's `array_bytes`
        counts states)."""
        return sum(t.numel() * t.element_size() for t in self.state_dict().values() if t.dim())


def frozen_router(feature_dim: int, config: RouterConfig, state: dict[str, np.ndarray]) -> SlotRouter:
    """The router restored to `state` with its parameters frozen: the memory a head is trained and read through."""
    router = SlotRouter.from_state(feature_dim, config, state)
    router.requires_grad_(False)
    return router
