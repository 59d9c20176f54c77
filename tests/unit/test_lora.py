"""LoRA injection on the three backbone families NSR and MIITA use: open_clip ViT (fused in_proj),
BERT (separate query/value Linears) and Llama (q_proj/v_proj, grouped-query v)."""

import copy

import numpy as np
import pytest
import torch

from memcl_ops.models.lora import TARGET_PRESETS, LoRAAdapters, LoRAConfig, adaptable_sites, backbone_parameters


def tiny_vit():
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=16, patch_size=8, width=32, layers=2, heads=4, mlp_ratio=2.0,
                             output_dim=24).eval()


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16)
    return BertModel(cfg).eval()


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=16)
    return LlamaForCausalLM(cfg).eval()


IMAGES = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
TOKENS = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(2))

FAMILIES = {
    "open_clip": (tiny_vit, lambda m: m(IMAGES), TARGET_PRESETS["open_clip_qv"]),
    "bert": (tiny_bert, lambda m: m(input_ids=TOKENS).last_hidden_state, TARGET_PRESETS["bert_qv"]),
    "llama": (tiny_llama, lambda m: m(input_ids=TOKENS).logits, TARGET_PRESETS["llama_qv"]),
}


def randomize_B(adapters: LoRAAdapters, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapters.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_targets_pick_q_and_v_of_every_block(family):
    build, _, _ = FAMILIES[family]
    adapters = LoRAAdapters(build())
    assert len(adapters.sites) == 4  # q and v in 2 blocks
    ends = sorted({name.rsplit(".", 1)[-1] for name in adapters.sites})
    assert ends in (["q", "v"], ["query", "value"], ["q_proj", "v_proj"])


@pytest.mark.parametrize("family", FAMILIES)
def test_fresh_and_disabled_adapters_leave_outputs_bit_identical(family):
    build, forward, targets = FAMILIES[family]
    model = build()
    with torch.no_grad():
        base = forward(model)
        adapters = LoRAAdapters(model, LoRAConfig(targets=targets))
        assert torch.equal(forward(model), base)  # B = 0
        randomize_B(adapters)
        changed = forward(model)
        with adapters.disabled():
            assert torch.equal(forward(model), base)
    assert not torch.allclose(changed, base)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapted_model_equals_backbone_with_delta_added_to_the_weights(family):
    """The reference adds ΔW = (α/r)·B A by hand to a copy's weight (rows of the fused in_proj for open_clip)."""
    build, forward, targets = FAMILIES[family]
    model = build()
    reference = copy.deepcopy(model)
    adapters = LoRAAdapters(model, LoRAConfig(rank=3, alpha=5.0, targets=targets))
    randomize_B(adapters)
    ref_sites = adaptable_sites(reference)
    with torch.no_grad():
        for name in adapters.sites:
            site = ref_sites[name]
            weight = getattr(site.module, site.tensor)
            weight[site.rows[0]:site.rows[1]] += adapters.delta(name)
        torch.testing.assert_close(forward(model), forward(reference), rtol=1e-5, atol=1e-5)


def test_open_clip_q_and_v_are_separate_row_blocks_of_the_fused_projection_and_k_is_untouched():
    model = tiny_vit()
    adapters = LoRAAdapters(model, LoRAConfig(targets=TARGET_PRESETS["open_clip_qv"]))
    randomize_B(adapters)
    attn = model.transformer.resblocks[0].attn
    original = attn.parametrizations.in_proj_weight.original
    with torch.no_grad():
        diff = attn.in_proj_weight - original
    e = attn.embed_dim
    assert diff[:e].abs().sum() > 0 and diff[2 * e:].abs().sum() > 0
    assert torch.equal(diff[e:2 * e], torch.zeros(e, e))
    torch.testing.assert_close(diff[:e], adapters.delta("transformer.resblocks.0.attn.q"))


@pytest.mark.parametrize("family", FAMILIES)
def test_only_factors_train_and_the_backbone_stays_bit_identical(family):
    build, forward, targets = FAMILIES[family]
    model = build()
    before = {k: v.detach().clone() for k, v in backbone_parameters(model).items()}
    adapters = LoRAAdapters(model, LoRAConfig(targets=targets))
    assert not any(p.requires_grad for p in backbone_parameters(model).values())
    assert set(before) == set(backbone_parameters(model))
    opt = torch.optim.Adam(adapters.parameters(), lr=1e-2)
    for _ in range(3):
        loss = forward(model).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert any(p.abs().sum() > 0 for p in adapters.parameters()[1::2])  # B moved away from 0
    after = backbone_parameters(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_factor_state_round_trips_exactly_and_bad_state_is_refused():
    model = tiny_bert()
    adapters = LoRAAdapters(model, LoRAConfig(targets=TARGET_PRESETS["bert_qv"]))
    randomize_B(adapters)
    state = adapters.factors()
    with torch.no_grad():
        out = forward_bert(model)
        adapters.reset(seed=9)
        assert not torch.equal(forward_bert(model), out)
        adapters.load_factors(state)
        assert torch.equal(forward_bert(model), out)
    key = next(iter(state))
    with pytest.raises(ValueError, match="shape"):
        adapters.load_factors({**state, key: np.zeros((1, 1), np.float32)})
    with pytest.raises(ValueError, match="lacks"):
        adapters.load_factors({k: v for k, v in state.items() if k != key})


def forward_bert(model):
    return model(input_ids=TOKENS).last_hidden_state


def test_load_deltas_sets_low_rank_deltas_and_keeps_the_spare_components_trainable():
    model = tiny_llama()
    adapters = LoRAAdapters(model, LoRAConfig(rank=4, alpha=8.0, targets=TARGET_PRESETS["llama_qv"]))
    gen = torch.Generator().manual_seed(5)
    name = next(n for n in adapters.sites if n.endswith("v_proj"))
    site = adapters.sites[name]
    assert (site.d_out, site.d_in) == (16, 32)  # grouped-query: 2 kv heads of width 8
    bd, ad = torch.randn(site.d_out, 2, generator=gen), torch.randn(2, site.d_in, generator=gen)
    adapters.load_deltas({name: (bd.numpy(), ad.numpy())})
    torch.testing.assert_close(adapters.delta(name), bd @ ad)
    others = [n for n in adapters.sites if n != name]
    assert all(torch.equal(adapters.delta(n), torch.zeros_like(adapters.delta(n))) for n in others)
    A = adapters.factors()[f"{name}.A"]
    assert np.abs(A[2:]).sum() > 0  # spare rows of A are the fresh init, not zeros (B's spare columns are 0)
    with pytest.raises(ValueError, match="rank"):
        adapters.load_deltas({name: (torch.randn(16, 5).numpy(), torch.randn(5, 32).numpy())})


def test_targets_that_match_nothing_are_refused_with_the_site_names():
    with pytest.raises(ValueError, match=r"match no site.*sites look like"):
        LoRAAdapters(tiny_bert(), LoRAConfig(targets=r"\.nonexistent$"))
    with pytest.raises(ValueError, match="not a valid regex"):
        LoRAConfig(targets="(")


def test_remove_restores_the_original_module():
    model = tiny_vit()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = LoRAAdapters(model)
    randomize_B(adapters)
    adapters.remove()
    state = model.state_dict()
    assert set(state) == set(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
