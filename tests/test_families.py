"""Every architecture family on a tiny random config: features equal Hugging Face's own forward.

For each family in the architecture table, a 2-layer 32-dim config built in
code (``tiny-<family>``) is loaded both through reservoir and as the bare
Hugging Face model; layer-k features at the last real token of right-padded
sequences must equal the model's own ``hidden_states[k]`` for every k. The
freeze groups must cover every parameter once, the stored final norm must
equal the module's, and eager attention must hand its weights to ``plot
attention``'s hook.
"""

import json

import numpy as np
import pytest
import torch

from reservoir.backbones import load_backbone
from reservoir.backbones.arch import ARCHS, get_module, norm_types
from reservoir.backbones.load import _load_hf
from reservoir.backbones.names import TINY_CONFIGS
from reservoir.errors import ReservoirError
from reservoir.readouts.features import apply_final_norm
from reservoir.training.freeze import GROUPS, apply_freeze, parameter_groups

FAMILIES = {"gpt2": "tiny-gpt2", "bert": "tiny-bert", "llama": "tiny-llama", "mistral": "tiny-mistral",
            "qwen2": "tiny-qwen2", "qwen3": "tiny-qwen3", "gemma": "tiny-gemma", "gemma2": "tiny-gemma2",
            "gpt_neox": "tiny-pythia", "opt": "tiny-opt", "roberta": "tiny-roberta",
            "distilbert": "tiny-distilbert", "vit": "tiny-vit"}
NAMES = sorted(FAMILIES.values())


def test_every_family_has_a_tiny_config():
    assert set(FAMILIES) == set(ARCHS)
    assert set(NAMES) <= set(TINY_CONFIGS)


def _hf_hidden_states(hf, bb, x, lengths):
    """The bare HF model's ``hidden_states`` for inputs ``bb.project(x)`` (ViT: its embedding output replaced)."""
    L = x.shape[1]
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    embeds = bb.project(x)  # (B, L, n_dim)
    if bb.info.family != "vit":
        return hf(inputs_embeds=embeds, attention_mask=mask, output_hidden_states=True).hidden_states
    # ViT takes pixels only: its patch embedding is replaced by our layer 0 (projected input + its patch positions)
    handle = hf.embeddings.register_forward_hook(lambda module, args, out: bb.embed(x))
    try:
        size = hf.config.image_size
        pixels = torch.zeros(len(x), hf.config.num_channels, size, size)
        return hf(pixel_values=pixels, attention_mask=mask, output_hidden_states=True).hidden_states
    finally:
        handle.remove()


def _reservoir_and_hf(name: str, attn: str, seed: int):
    """The tiny family loaded as a reservoir and as the bare HF model, and 4 right-padded rows of 40 positions."""
    bb = load_backbone(name, d_in=5, attn_implementation=attn)
    hf, _, _ = _load_hf(name, "pretrained", 0, None, attn)
    hf.eval()
    x = torch.randn(4, 40, 5, generator=torch.Generator().manual_seed(seed))
    return bb, hf, x, torch.tensor([40, 23, 1, 31])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", NAMES)
def test_features_equal_hf_hidden_states(name, attn):
    """Layer k at the last real token == the HF model's hidden_states[k], right-padded, every k.

    Sequences of 40 positions exceed the 16-position sliding windows of
    tiny-mistral and tiny-gemma2, so windowed masks are exercised too.
    """
    bb, hf, x, lengths = _reservoir_and_hf(name, attn, seed=0)
    layers = list(range(bb.depth + 1))
    with torch.no_grad():
        feats = bb.features(x, lengths, layers)  # (4, 3, 1, 32)
        ref = _hf_hidden_states(hf, bb, x, lengths)
        rows = torch.arange(4)
        assert len(ref) == bb.depth + 1
        for k in layers:
            ours = feats[:, k, 0]
            if k == bb.depth and bb.final_norm is not None and bb.info.family != "vit":
                ours = bb.apply_final_norm(ours)  # HF's last entry comes after the final norm (ViT's before it)
            torch.testing.assert_close(ours, ref[k][rows, lengths - 1], atol=2e-5, rtol=2e-5,
                                       msg=lambda m: f"{name} layer {k}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_padding_and_split_point_do_not_move_features(name):
    """Padding more does not change the real tokens' features; blocks run from layer 1 give the same top layer."""
    bb = load_backbone(name, d_in=7)
    seq = torch.randint(0, 7, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = bb.features(seq, torch.tensor([20]), [0, 1, 2], n_out_tokens=3)
        padded = torch.cat([seq, torch.randint(0, 7, (1, 9))], dim=1)
        torch.testing.assert_close(bb.features(padded, torch.tensor([20]), [0, 1, 2], n_out_tokens=3), base,
                                   atol=1e-5, rtol=1e-5)
        h0 = bb.embed(seq)
        masks = bb.attention_mask(torch.tensor([20]), 20, h0.dtype)
        h1 = dict(bb.run_blocks(h0, masks, 0, 1))[1]
        h2 = dict(bb.run_blocks(h1, masks, 1, 2))[2]
    torch.testing.assert_close(h2[:, -3:], base[:, 2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_freeze_groups_cover_every_parameter_once(name):
    bb = load_backbone(name, d_in=3)
    head = torch.nn.Linear(bb.n_dim, 2)
    counts = apply_freeze(bb, head, GROUPS)  # raises when a parameter is in no group or in two
    total = sum(p.numel() for p in [*bb.parameters(), *head.parameters()])
    assert counts["total"] == total == counts["trainable"]
    assert sum(counts[g] for g in GROUPS) == total
    groups = parameter_groups(bb, head)
    norms = [m for m in bb.modules() if isinstance(m, norm_types())]
    assert norms and sum(p.numel() for m in norms for p in m.parameters()) == counts["layernorm"]
    assert counts["attention"] > 0 and counts["feedforward"] > 0
    if bb.arch.rotary is not None:
        assert groups["positions"] == [] and bb.position_table() is None
    else:
        assert counts["positions"] == bb.position_table().numel()


def test_rotary_positions_group_is_empty_and_said(caplog):
    bb = load_backbone("tiny-llama", d_in=3)
    with caplog.at_level("WARNING", logger="reservoir"):
        counts = apply_freeze(bb, torch.nn.Linear(32, 2), ("positions", "output"))
    assert counts["positions"] == 0 and counts["trainable"] == 32 * 2 + 2
    assert "no learned position table (rotary positions)" in caplog.text


@pytest.mark.parametrize("name", NAMES)
def test_stored_final_norm_equals_the_module(name):
    """What a readout applies to stored features (numpy) equals the model's own final norm."""
    bb = load_backbone(name, d_in=3, init="random", seed=4)
    arrays = bb.final_norm_arrays()
    if bb.final_norm is None:
        assert arrays is None and not bb.arch.pre_norm
        return
    with torch.no_grad():
        bb.final_norm.weight.normal_(generator=torch.Generator().manual_seed(5))  # a non-trivial scale
        arrays = bb.final_norm_arrays()
        h = torch.randn(6, bb.n_dim, generator=torch.Generator().manual_seed(6)) * 3 + 1
        ref = bb.apply_final_norm(h).numpy()
    ours = apply_final_norm(h.numpy(), arrays, bb.info.to_dict())
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)
    assert bb.info.final_norm_kind == (None if isinstance(bb.final_norm, torch.nn.LayerNorm) else "rms")


@pytest.mark.parametrize("name", NAMES)
def test_eager_attention_weights_reach_the_hook(name):
    """The module ARCHS names for ``plot attention`` returns, under eager attention, (B, H, L, L) rows summing to 1."""
    bb = load_backbone(name, d_in=3, attn_implementation="eager")
    seen = []
    module = get_module(bb.blocks[0], bb.arch.attention_weights)
    handle = module.register_forward_hook(lambda m, args, out: seen.append(out[1]))
    try:
        with torch.no_grad():
            bb.features(torch.randn(2, 9, 3), torch.tensor([9, 5]), [1])
    finally:
        handle.remove()
    (weights,) = seen
    assert weights.shape == (2, bb.config.num_attention_heads, 9, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, bb.config.num_attention_heads, 9))


def test_max_positions_come_from_the_config():
    assert load_backbone("tiny-llama", d_in=1).info.max_positions == 1024
    assert load_backbone("tiny-roberta", d_in=1).info.max_positions == 1024  # 1026 rows less the padding offset 2
    assert load_backbone("tiny-vit", d_in=1).info.max_positions == (128 // 4) ** 2  # patches; CLS row not read
    assert load_backbone("tiny-opt", d_in=1).position_offset == 2


def test_opt_with_project_in_is_refused(tmp_path):
    from transformers import OPTConfig

    OPTConfig(hidden_size=32, word_embed_proj_dim=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=8,
              vocab_size=8).save_pretrained(tmp_path)
    with pytest.raises(ReservoirError, match="expected word_embed_proj_dim equal to hidden_size"):
        load_backbone(str(tmp_path), d_in=3, init="random")


def test_gemma2_softcapping_uses_eager_attention():
    bb = load_backbone("tiny-gemma2", d_in=3)
    assert bb.attn_implementation == "eager"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt", "tiny-pythia", "tiny-gpt2"])
def test_training_dropout_reaches_every_family(name):
    """``--dropout`` sets nn.Dropout modules and the float rates Llama-style and OPT modules apply functionally."""
    from reservoir.training.loop import DROPOUT_ATTRS, _set_dropout

    bb = load_backbone(name, d_in=3)
    _set_dropout(bb, 0.25)
    rates = [m.p for m in bb.modules() if isinstance(m, torch.nn.Dropout)]
    rates += [getattr(m, a) for m in bb.modules() for a in DROPOUT_ATTRS if isinstance(getattr(m, a, None), float)]
    assert len(rates) >= bb.depth and set(rates) == {0.25}
    x, lengths = torch.randn(2, 6, 3), torch.tensor([6, 6])
    bb.train()
    with torch.no_grad():
        a, b = bb.features(x, lengths, [2]), bb.features(x, lengths, [2])
    assert not torch.equal(a, b)  # dropout is live in every family


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-qwen3"])
def test_bench_extract_times_every_family(name, tmp_path):
    """``bench extract`` runs the family's own HF forward too (ViT's from embeddings, in place of its patches)."""
    from click.testing import CliRunner

    from reservoir.cli import main

    args = ["bench", "extract", "--task", "bit-xor", "-p", "n_train=48", "-p", "n_test=16", "--backbone", name,
            "--layers", "2", "--device", "cpu", "--naive-rows", "8", "--quiet", "--out", str(tmp_path / "b.json")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["hf_forward_s"] > 0 and b["naive_s"] > 0 and b["n_rows"] == 64


def test_vit_hf_forward_from_embeddings_equals_hidden_states():
    from reservoir.bench.reference import hf_forward

    bb = load_backbone("tiny-vit", d_in=3)
    hf, _, _ = _load_hf("tiny-vit", "pretrained", 0, None, "sdpa")
    x, lengths = torch.randn(3, 12, 3), torch.tensor([12, 7, 3])
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    with torch.no_grad():
        ours = hf_forward(hf.eval(), bb.project(x), mask, output_hidden_states=True).hidden_states  # positions added
        ref = _hf_hidden_states(hf, bb, x, lengths)
    assert isinstance(hf.embeddings, type(get_module(hf, "embeddings"))) and len(ours) == len(ref) == 3
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


def test_rms_family_store_reads_through_its_final_norm(tmp_path):
    """A Qwen3 store keeps its RMSNorm (kind, eps, scale) and the readout applies it as the model does."""
    from reservoir import extract, get_task
    from reservoir.readouts.features import load_layer

    task = get_task("bit-xor", n_train=40, n_test=12)
    bb = load_backbone("tiny-qwen3", d_in=task.d_in, depth=2)
    store = extract(task, bb, tmp_path / "q.zarr", layers=[1, 2], dtype="float32", device="cpu", progress=False)
    assert store.attrs["backbone"]["final_norm_kind"] == "rms"
    raw, _ = load_layer(store, "test", 2, final_norm=False)
    normed, _ = load_layer(store, "test", 2)
    with torch.no_grad():
        ref = bb.apply_final_norm(torch.from_numpy(raw)).numpy()
    np.testing.assert_allclose(normed, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-pythia"])
def test_cast_keeps_rotary_frequencies_in_float32(name):
    """Weights go to bf16 for inference; the rotary frequencies stay exact float32, as HF computes cos/sin."""
    bb = load_backbone(name, d_in=3)
    before = {n: b.clone() for n, b in bb.rotary.named_buffers()}
    bb.cast(torch.bfloat16)
    assert {p.dtype for p in bb.parameters()} == {torch.bfloat16}
    for n, b in bb.rotary.named_buffers():
        assert b.dtype == torch.float32 and torch.equal(b, before[n])
    with torch.no_grad():
        cos, sin = bb.rotary(torch.zeros(1, 600, 32, dtype=torch.bfloat16), torch.arange(600)[None])
    assert cos.dtype == torch.bfloat16


@pytest.mark.parametrize("name", NAMES)
def test_every_init_loads_frozen_with_finite_features(name):
    """pretrained, random (seeded, its own draw) and stats (re-drawn from the pretrained moments) for every family."""
    x, lengths = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([8, 5])
    shas = set()
    for init in ("pretrained", "random", "stats"):
        bb = load_backbone(name, d_in=3, init=init, seed=11)
        assert not any(p.requires_grad for p in bb.parameters()) and not bb.training
        with torch.no_grad():
            assert torch.isfinite(bb.features(x, lengths, [0, 1, 2])).all()
        shas.add(bb.info.weights_sha256)
    assert len(shas) == 3
    assert load_backbone(name, d_in=3, init="random", seed=11).info.weights_sha256 in shas  # seeded: reproducible


@pytest.mark.parametrize("family", ["vit", "roberta"])
def test_checkpoint_without_a_pooler_hashes_the_same_every_load(tmp_path, family, caplog):
    """A classifier's checkpoint lacks the bare model's pooler: its draw is fixed, and unused modules go unmentioned."""
    from transformers import CONFIG_MAPPING, AutoModelForImageClassification, AutoModelForMaskedLM

    spec = {k: v for k, v in TINY_CONFIGS[f"tiny-{family}"].items() if k != "model_type"}
    config = CONFIG_MAPPING[family](**spec)
    make = AutoModelForImageClassification if family == "vit" else AutoModelForMaskedLM
    make.from_config(config).save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="reservoir"):
        shas = {load_backbone(str(tmp_path), d_in=3).info.weights_sha256 for _ in range(3)}
    assert len(shas) == 1
    assert "random init" not in caplog.text


def test_gemma2_without_softcapping_loads_with_eager_attention(tmp_path):
    from transformers import Gemma2Config

    spec = {k: v for k, v in TINY_CONFIGS["tiny-gemma2"].items() if k != "model_type"}
    Gemma2Config(**spec, attn_logit_softcapping=None).save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path), d_in=3, init="random")
    assert bb.attn_implementation == "eager"


def test_roberta_without_pad_token_is_refused(tmp_path):
    from transformers import RobertaConfig

    spec = {k: v for k, v in TINY_CONFIGS["tiny-roberta"].items() if k not in ("model_type", "pad_token_id")}
    RobertaConfig(**spec, pad_token_id=None).save_pretrained(tmp_path)
    with pytest.raises(ReservoirError, match="expected pad_token_id in the config"):
        load_backbone(str(tmp_path), d_in=3, init="random")


def test_final_norm_without_affine_is_stored_as_unit_scale(tmp_path):
    from transformers import OPTConfig

    spec = {k: v for k, v in TINY_CONFIGS["tiny-opt"].items() if k != "model_type"}
    OPTConfig(**spec, layer_norm_elementwise_affine=False).save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path), d_in=3, init="random")
    arrays = bb.final_norm_arrays()
    assert np.array_equal(arrays["weight"], np.ones(32, np.float32)) and not arrays["bias"].any()
    h = torch.randn(4, 32)
    with torch.no_grad():
        np.testing.assert_allclose(apply_final_norm(h.numpy(), arrays, bb.info.to_dict()),
                                   bb.apply_final_norm(h).numpy(), atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_mean_and_first_pooling_equal_hf_hidden_states(name):
    """Mean pooling == an independent masked mean of the HF model's hidden_states[k] over the real positions of
    right-padded rows (padding never counts); first pooling == hidden_states[k][:, 0]. HF's last entry of a
    pre-norm model comes after its final norm (the store keeps raw residuals), so that entry is left out."""
    bb, hf, x, lengths = _reservoir_and_hf(name, "eager", seed=1)
    layers = list(range(bb.depth + 1))
    with torch.no_grad():
        feats = bb.features(x, lengths, layers, poolings=("mean", "first", "last"))  # (4, 3, 3, 1, 32)
        ref = _hf_hidden_states(hf, bb, x, lengths)
        real = (torch.arange(40)[None] < lengths[:, None]).float()  # (4, 40)
        normed_last = bb.final_norm is not None and bb.info.family != "vit"
        for k in layers[:-1] if normed_last else layers:
            h = ref[k]  # (4, 40, 32)
            mean = (h * real[..., None]).sum(1) / lengths[:, None]
            torch.testing.assert_close(feats[:, 0, k, 0], mean, atol=2e-5, rtol=2e-5, msg=lambda m: f"{name} {k}: {m}")
            torch.testing.assert_close(feats[:, 1, k, 0], h[:, 0], atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(feats[:, 2, k, 0], h[torch.arange(4), lengths - 1], atol=2e-5, rtol=2e-5)
        # padding never counts: garbage beyond each row's length leaves every pooling unchanged
        x2 = x.clone()
        x2[torch.arange(40)[None].expand(4, -1) >= lengths[:, None]] = 100.0
        torch.testing.assert_close(bb.features(x2, lengths, layers, poolings=("mean", "first", "last")), feats,
                                   atol=2e-5, rtol=2e-5)
