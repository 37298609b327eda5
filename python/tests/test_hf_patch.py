"""xent.transformers.apply on tiny random causal LMs of each family (Llama,
Qwen2, Qwen3, Mistral, Gemma, Gemma-2 with final logit soft-capping,
Gemma-3), built offline from transformers' config classes (no hub access):
the patched model's loss and every parameter gradient equal the unpatched
model's, in float32 on the CPU, fused and not, with and without
`num_items_in_batch`; labels=None, eval and generation are untouched.

Bound (derived): the two models run the same float32 ops up to the final
hidden states h, so they differ only in the head:
  * fused=False: the same fp32 logits; torch's fp32 log_softmax + NLL has
    an error of a few ulp of the row's lse (exp / sum / log in fp32,
    ~(log2 V + 4) u |lse| with u = 2^-24), xent's is one ulp of the nll.
  * fused=True: the fp32 logits may differ by the summation order of the
    length-H dot products, |dz| <= 2 gamma_H S_j (S_j = sum_k |h_k w_jk|,
    ~ H * 0.02^2 * |h|... small here), so the nll by 2 max |dz|.
For these models (H = 32, V = 128, |z| < 1, lse ~ log 128 = 4.9) every
term is below 20 u |lse| ~ 6e-6, so the loss is checked to 1e-5 relative.
The gradients are chains of fp32 products from dlogits, whose elements
differ by the same relative amounts (p_j carries the lse error, ~20 u);
the parameter gradients are checked to 1e-4 relative in norm (the backbone
adds its own fp32 roundings identically on both sides, and the relative
error of a sum of many terms of both signs can grow by the cancellation,
measured values ~1e-6 are printed with -s).
"""
import copy
import os

import pytest

try:
    import torch
except ImportError as e:
    pytest.skip("PyTorch is not importable (%s): the transformers tests are "
                "skipped" % e, allow_module_level=True)
try:
    import transformers  # noqa: F401
except ImportError as e:
    if os.environ.get("CI") == "true" or \
            os.environ.get("XENT_REQUIRE_TORCH") == "1":
        raise
    pytest.skip("transformers is not importable (%s): pip install "
                "transformers" % e, allow_module_level=True)

import xent  # noqa: E402
import xent.transformers as XT  # noqa: E402

REL_LOSS, REL_GRAD = 1e-5, 1e-4
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def make(family, seed):
    import transformers as tf
    cfg_cls, extra = {
        "llama": (tf.LlamaConfig, {}),
        "qwen2": (tf.Qwen2Config, {}),
        "qwen3": (tf.Qwen3Config, dict(head_dim=8)),
        "mistral": (tf.MistralConfig, {}),
        "gemma": (tf.GemmaConfig, dict(head_dim=8)),
        "gemma2": (tf.Gemma2Config, dict(head_dim=8,
                                         final_logit_softcapping=3.0)),
        "gemma3": (tf.Gemma3TextConfig, dict(head_dim=8,
                                             final_logit_softcapping=3.0)),
    }[family]
    cfg = cfg_cls(**TINY, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = XT._family_class(family)(cfg).float()
    # larger output weights than the 0.02 init so the loss is not ~log V
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    return model.train()


def batch(seed, V):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2, 9), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    labels[1, -2:] = -100
    return ids, labels


def rel(a, b):
    a, b = a.double(), b.double()
    n = b.norm().item()
    return (a - b).norm().item() / (n if n > 0 else 1.0)


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2",
            "gemma3"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fused", [True, False])
def test_patched_equals_unpatched(rng, family, fused):
    seed = int(rng.integers(1 << 30))
    print("seed", seed)
    ref = make(family, seed)
    model = copy.deepcopy(ref)
    XT.apply(model, fused=fused)
    V = ref.config.vocab_size
    ids, labels = batch(seed, V)
    n_items = torch.tensor(int((labels[:, 1:] != -100).sum()) + 3)
    for kw in ({}, {"num_items_in_batch": n_items}):
        for m in (ref, model):
            m.zero_grad(set_to_none=True)
        out_r = ref(input_ids=ids, labels=labels, **kw)
        out_x = model(input_ids=ids, labels=labels, **kw)
        assert torch.isfinite(out_x.loss)
        if fused:
            assert out_x.logits is None
        else:
            assert torch.equal(out_x.logits, out_r.logits)
        lr, lx = out_r.loss.item(), out_x.loss.item()
        out_r.loss.backward()
        out_x.loss.backward()
        worst = 0.0
        named = dict(model.named_parameters())
        for name, p in ref.named_parameters():
            q = named[name]
            assert q.grad is not None and torch.isfinite(q.grad).all(), name
            r = rel(q.grad, p.grad)
            worst = max(worst, r)
            assert r <= REL_GRAD, (family, name, r)
        print("%s fused=%s %s: loss %.7g vs %.7g (rel %.2g), worst grad "
              "rel %.2g" % (family, fused, "num_items" if kw else "mean",
                            lx, lr, abs(lx - lr) / abs(lr), worst))
        assert abs(lx - lr) <= REL_LOSS * abs(lr), (family, lx, lr)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_untouched_without_labels_and_in_generation(family):
    ref = make(family, 7)
    model = copy.deepcopy(ref)
    XT.apply(model)
    ids, labels = batch(7, ref.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits,
                           ref(input_ids=ids).logits)
        ref.eval()
        model.eval()
        # eval with labels: the model's own forward (logits and loss)
        a = model(input_ids=ids, labels=labels)
        b = ref(input_ids=ids, labels=labels)
        assert torch.equal(a.logits, b.logits) and torch.equal(a.loss,
                                                               b.loss)
        g1 = model.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
        g2 = ref.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
    assert torch.equal(g1, g2)
    XT.revert(model)
    assert "forward" not in model.__dict__


def test_class_patch_and_revert():
    import transformers as tf
    cls = XT._family_class("llama")
    XT.apply("llama")
    try:
        assert hasattr(cls.forward, "_xent_orig")
        model = make("llama", 3)
        ids, labels = batch(3, model.config.vocab_size)
        out = model(input_ids=ids, labels=labels)
        assert out.logits is None and torch.isfinite(out.loss)
        XT.apply(tf.LlamaForCausalLM, fused=False)
        assert not hasattr(cls.forward, "_xent_orig")
        assert model.loss_function is XT.causal_lm_loss
    finally:
        XT.revert("llama")
    assert not hasattr(cls.forward, "_xent_orig")
    assert "_loss_function" not in cls.__dict__
