"""LoRA adapters on a frozen backbone (Hu et al. 2021): W' = W + (α/r)·B A on chosen weight tensors.

A *site* is one weight (or one row block of a weight) an adapter can sit on, named after its module:

| module | site name(s) | adapted tensor |
|---|---|---|
| any `nn.Linear` `<m>` (BERT `query`, Llama `q_proj`, open_clip `mlp.c_fc`) | `<m>` | `weight` |
| `nn.MultiheadAttention` `<m>` with a fused in-projection (open_clip) | `<m>.q`, `<m>.k`, `<m>.v` | row blocks |

The row blocks of the fused projection are `[0:E]`, `[E:2E]`, `[2E:3E]` of `in_proj_weight` (E = embed dim).
So "LoRA on q and v" is the regex `\\.attn\\.[qv]$` for open_clip (two row blocks of the fused `in_proj_weight`,
each with its own A, B), `\\.attention\\.self\\.(query|value)$` for BERT/MiniLM and `\\.self_attn\\.[qv]_proj$` for
Llama-style causal LMs; `LoRAConfig.targets` defaults to the union of the three.

Mechanism: a `torch.nn.utils.parametrize` parametrization on the adapted tensor, so every reader of the tensor
sees W + ΔW. That matters for `nn.MultiheadAttention`, which never calls its sub-modules: it hands
`in_proj_weight` and `out_proj.weight` straight to `F.multi_head_attention_forward`, so a forward hook or a
wrapped `nn.Linear` would silently do nothing there. The original tensor is kept untouched (frozen) under
`parametrizations.<tensor>.original`; `remove()` puts it back. The cost is materialising W + ΔW once per forward
(O(d_out·d_in·r) per site), small next to the activations at these widths.

Own code rather than `peft`: peft's `nn.MultiheadAttention` support (huggingface/peft#1324) puts one adapter on
the whole fused in-projection (q, k and v together), not on q and v separately; and NSR needs exact numpy
round-trips of the factors and of low-rank deltas of any rank ≤ r (the bank's compressed entries), which is a few
lines here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

TARGET_PRESETS = {
    "open_clip_qv": r"\.attn\.[qv]$",
    "bert_qv": r"\.attention\.self\.(query|value)$",
    "llama_qv": r"\.self_attn\.[qv]_proj$",
}
QV_ANY_FAMILY = "|".join(f"(?:{p})" for p in TARGET_PRESETS.values())


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 8  # r [R] (docs/methods.md, "NSR")
    alpha: float = 16.0  # ΔW = (α/r)·B A [R]
    targets: str = QV_ANY_FAMILY  # regex searched in site names (see the module table)
    seed: int = 0  # initialisation of A (B starts at 0, so a fresh adapter leaves the backbone unchanged)

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
        try:
            re.compile(self.targets)
        except re.error as err:
            raise ValueError(f"LoRA targets {self.targets!r} is not a valid regex: {err}") from None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True)
class Site:
    """One adaptable weight: `module.<tensor>[rows]`, shape (d_out, d_in)."""

    name: str
    module: nn.Module
    tensor: str
    rows: tuple[int, int]
    d_in: int

    @property
    def d_out(self) -> int:
        return self.rows[1] - self.rows[0]


def adaptable_sites(model: nn.Module) -> dict[str, Site]:
    """Every site of `model` (whether or not a config targets it), by name."""
    sites: dict[str, Site] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            sites[name] = Site(name, module, "weight", (0, module.out_features), module.in_features)
        elif isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
            e = module.embed_dim
            for i, part in enumerate("qkv"):
                sites[f"{name}.{part}"] = Site(f"{name}.{part}", module, "in_proj_weight", (i * e, (i + 1) * e), e)
    return sites


class _Factors(nn.Module):
    def __init__(self, site: Site, rank: int, like: torch.Tensor):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(rank, site.d_in, dtype=like.dtype, device=like.device))
        self.B = nn.Parameter(torch.zeros(site.d_out, rank, dtype=like.dtype, device=like.device))


class _RowBlockDelta(nn.Module):
    """Parametrization W -> W + scale·B_i A_i on the row block of each site i sharing the tensor W."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.enabled = True
        self.blocks: list[tuple[tuple[int, int], _Factors]] = []
        self.factors = nn.ModuleList()

    def add(self, rows: tuple[int, int], factors: _Factors) -> None:
        self.factors.append(factors)
        self.blocks = sorted([*self.blocks, (rows, factors)], key=lambda b: b[0])

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return weight
        parts, at = [], 0
        for (start, stop), f in self.blocks:
            if start > at:
                parts.append(weight[at:start])
            parts.append(weight[start:stop] + self.scale * (f.B @ f.A))
            at = stop
        if at < weight.shape[0]:
            parts.append(weight[at:])
        return torch.cat(parts) if len(parts) > 1 else parts[0]


class LoRAAdapters:
    """Rank-r LoRA factors on every site of `model` matching `config.targets`; the whole backbone is frozen.

    Only `parameters()` (the A and B factors) are trainable. Factor state is a dict of float32 numpy arrays
    `{"<site>.A": (r, d_in), "<site>.B": (d_out, r)}` that round-trips exactly.
    """

    def __init__(self, model: nn.Module, config: LoRAConfig = LoRAConfig()):
        self.model, self.config = model, config
        pattern = re.compile(config.targets)
        every = adaptable_sites(model)
        self.sites = {name: s for name, s in every.items() if pattern.search(name)}
        if not self.sites:
            examples = ", ".join(list(every)[:6]) or "none (the model has no nn.Linear or nn.MultiheadAttention)"
            raise ValueError(f"LoRA targets {config.targets!r} match no site of {type(model).__name__}; "
                             f"sites look like: {examples}")
        model.requires_grad_(False)
        self._factors: dict[str, _Factors] = {}
        self._deltas: dict[tuple[int, str], _RowBlockDelta] = {}
        for name, site in self.sites.items():
            key = (id(site.module), site.tensor)
            if key not in self._deltas:
                self._deltas[key] = _RowBlockDelta(config.scale)
                parametrize.register_parametrization(site.module, site.tensor, self._deltas[key])
            like = getattr(site.module.parametrizations, site.tensor).original
            self._factors[name] = _Factors(site, config.rank, like)
            self._deltas[key].add(site.rows, self._factors[name])
        self.reset()

    @property
    def scale(self) -> float:
        return self.config.scale

    def parameters(self) -> list[nn.Parameter]:
        return [p for f in self._factors.values() for p in (f.A, f.B)]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _initial_A(self, index: int, site: Site, seed: int) -> torch.Tensor:
        """nn.Linear's default (Kaiming-uniform, a=√5) init, seeded per site so any row of it is reproducible."""
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        bound = 1.0 / math.sqrt(site.d_in)
        return (torch.rand(self.config.rank, site.d_in, generator=gen) * 2 - 1) * bound

    @torch.no_grad()
    def reset(self, seed: int | None = None) -> None:
        """A fresh adapter: A random (seeded), B = 0, so ΔW = 0."""
        seed = self.config.seed if seed is None else seed
        for i, (name, f) in enumerate(self._factors.items()):
            f.A.copy_(self._initial_A(i, self.sites[name], seed))
            f.B.zero_()

    def factors(self) -> dict[str, np.ndarray]:
        out = {}
        for name, f in self._factors.items():
            out[f"{name}.A"] = f.A.detach().cpu().numpy().copy()
            out[f"{name}.B"] = f.B.detach().cpu().numpy().copy()
        return out

    @torch.no_grad()
    def load_factors(self, state: Mapping[str, np.ndarray]) -> None:
        """Set every site's A and B exactly (float32 copies of `state`, shapes as `factors()` gives them)."""
        expected = {k: v.shape for k, v in self.factors().items()}
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(f"LoRA factor state lacks {missing[:4]} (it has {sorted(state)[:4]}…)")
        for key, shape in expected.items():
            if tuple(np.shape(state[key])) != tuple(shape):
                raise ValueError(f"LoRA factor {key!r} has shape {np.shape(state[key])}, the adapter needs {shape}")
        for name, f in self._factors.items():
            f.A.copy_(torch.from_numpy(np.array(state[f"{name}.A"], dtype=np.float32)))
            f.B.copy_(torch.from_numpy(np.array(state[f"{name}.B"], dtype=np.float32)))

    @torch.no_grad()
    def load_deltas(self, deltas: Mapping[str, tuple[np.ndarray, np.ndarray]], seed: int | None = None) -> None:
        """Set each site's ΔW to `Bd @ Ad` given as factors of any rank k ≤ r (scale included).

        Components 0..k-1 hold (Bd/scale, Ad); components k..r-1 are fresh (A from the seeded init, B = 0), so
        they add nothing to ΔW yet stay trainable. Sites missing from `deltas` get a fresh adapter.
        """
        seed = self.config.seed if seed is None else seed
        unknown = sorted(set(deltas) - set(self._factors))
        if unknown:
            raise ValueError(f"deltas for unknown LoRA sites {unknown[:4]}; sites: {list(self._factors)[:4]}…")
        for i, (name, f) in enumerate(self._factors.items()):
            site = self.sites[name]
            A, B = self._initial_A(i, site, seed), torch.zeros(site.d_out, self.config.rank)
            if name in deltas:
                bd, ad = (torch.from_numpy(np.array(x, dtype=np.float32)) for x in deltas[name])
                k = bd.shape[1]
                if bd.shape != (site.d_out, k) or ad.shape != (k, site.d_in) or k > self.config.rank:
                    raise ValueError(f"delta factors for {name!r} have shapes {tuple(bd.shape)} and {tuple(ad.shape)}; "
                                     f"need ({site.d_out}, k) and (k, {site.d_in}) with k <= rank {self.config.rank}")
                A[:k], B[:, :k] = ad, bd / self.scale
            f.A.copy_(A)
            f.B.copy_(B)

    def delta(self, site: str) -> torch.Tensor:
        """ΔW = (α/r)·B A of one site, (d_out, d_in), detached."""
        f = self._factors[site]
        return (self.scale * f.B @ f.A).detach()

    def factor_pair(self, site: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale·B, A) of one site, detached: ΔW = product of the two."""
        f = self._factors[site]
        return (self.scale * f.B).detach(), f.A.detach()

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """The backbone exactly as it was before injection (ΔW not added at all) inside the block."""
        for d in self._deltas.values():
            d.enabled = False
        try:
            yield
        finally:
            for d in self._deltas.values():
                d.enabled = True

    def remove(self) -> None:
        """Take the adapters out and put the original tensors back."""
        for site in {(id(s.module), s.tensor): s for s in self.sites.values()}.values():
            parametrize.remove_parametrizations(site.module, site.tensor, leave_parametrized=False)
        self._deltas.clear()


_ORIGINAL = re.compile(r"parametrizations\.([^.]+)\.original$")


def backbone_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The backbone's own tensors by their pre-injection names (under a parametrization, its `original`)."""
    out = {}
    for name, p in model.named_parameters():
        if "parametrizations." not in name:
            out[name] = p
        elif m := _ORIGINAL.search(name):
            out[name[:m.start()] + m.group(1)] = p
    return out
