"""TRL's GRPOTrainer with xent's fused LM head (xent/trl.py, issue 45).

A tiny random Llama (made here, no download) and a word-level tokenizer
built in the test train for 2 GRPO steps on the CPU through
`xent.trl.GRPOTrainer`. At every loss step the test checks, on the
trainer's own inputs:

* the per-token log-probs and entropies the trainer's loss uses are
  xent's: bitwise `xent.linear_logprobs` on the model's final hidden states
  (completion positions), and within 1e-5 (absolute, nats) of a float64
  log_softmax of the unfused model's logits;
* the loss (num_iterations=2: the second step's ratio against the old
  policy's log-probs, which xent's head also computed, is not 1) equals
  TRL's loss computed on the plain PyTorch head's
  log-probs (TRL's formulas; 1e-5 relative) and its gradients (LM head
  and a decoder weight) match (1e-4 relative in norm);
* with xent_loss=True, the policy loss from xent.rl.trl_loss equals TRL's
  formula on the same log-probs, gradients included;

and after training that the weights changed. Runs in CI (TRL is in
.ci/setup-pip.txt); elsewhere it skips when TRL is absent.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable: "
                            "the TRL adapter tests need torch")
if os.environ.get("CI") == "true" or \
        os.environ.get("XENT_REQUIRE_TORCH") == "1":
    import trl  # noqa: F401  (CI installs it: a missing TRL is a failure)
else:
    pytest.importorskip("trl", reason="TRL is not installed (torch test "
                        "of the TRL adapter; CI installs it)")
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(torch test of the TRL adapter)")

import xent  # noqa: E402
import xent.trl  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          PreTrainedTokenizerFast)

WORDS = ["red", "green", "blue", "cat", "dog", "runs", "sits", "the", "a",
         "big", "small", "and", "on", "mat", "sun", "moon"]
TEMP = 0.7


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in WORDS:
        vocab[w] = len(vocab)
    for i in range(64 - len(vocab)):
        vocab["w%d" % i] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>",
                                   eos_token="<eos>", unk_token="<unk>")


def tiny_llama(tok):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float()


def reward(completions, **kw):
    # random rewards: the group advantages are non-zero, so the step moves
    return [float(x) for x in torch.rand(len(completions))]


def reference_logps(model, ids, am, keep):
    """float64 log_softmax(logits / T) of the unfused model at the
    completion positions: (logprob, entropy), differentiable."""
    logits = model(input_ids=ids, attention_mask=am).logits
    z = logits[:, -keep - 1:-1].double() / TEMP
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(-1, ids[:, -keep:, None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def rel_norm(a, b):
    return float((a.double() - b.double()).norm() /
                 b.double().norm().clamp(min=1e-30))


class Probe(xent.trl.GRPOTrainer):
    """Checks each loss step against the plain PyTorch head and TRL's own
    loss; records what it measured."""

    def _compute_loss(self, model, inputs):
        self.report.append(self._check(model, inputs))
        return super()._compute_loss(model, inputs)

    def _check(self, model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        keep = inputs["completion_ids"].size(1)
        mask = inputs["completion_mask"].bool()
        r = {}
        # 1. what the trainer's loss uses: its log-prob / entropy method
        lp, ent, _ = self._get_per_token_logps_and_entropies(
            model, ids, am, keep, compute_entropy=True)
        # ... is xent.linear_logprobs, bitwise, on the same hidden states
        with torch.no_grad():
            h = model.model(input_ids=ids, attention_mask=am) \
                .last_hidden_state[:, -keep - 1:-1]
            y = ids[:, -keep:]
            lab = y.masked_fill(am[:, -keep:] == 0, -100)
            sel = lab != -100
            lx, ex = xent.linear_logprobs(h[sel], model.lm_head.weight,
                                          lab[sel], temperature=TEMP,
                                          entropy=True)
        assert torch.equal(lp.detach()[sel], lx)
        assert torch.equal(ent.detach()[sel], ex)
        assert bool((lp.detach()[~sel] == 0).all())
        # ... and the exact log-probs of the unfused model
        lp_ref, ent_ref = reference_logps(model, ids, am, keep)
        r["lp_err"] = float((lp.detach().double() - lp_ref.detach())[mask]
                            .abs().max())
        r["ent_err"] = float((ent.detach().double() - ent_ref.detach())[mask]
                             .abs().max())
        # 2. the loss and its gradients against TRL's loss on the plain
        # head's log-probs
        params = [model.lm_head.weight,
                  model.model.layers[-1].mlp.down_proj.weight]
        loss = super()._compute_loss(model, inputs)
        g = torch.autograd.grad(loss, params)
        orig = self._get_per_token_logps_and_entropies

        def plain(*a, **k):
            lr, er = reference_logps(model, ids, am, keep)
            return lr.float(), er.float(), None
        self._get_per_token_logps_and_entropies = plain
        try:
            loss_ref = trl.GRPOTrainer._compute_loss(self, model, inputs)
        finally:
            self._get_per_token_logps_and_entropies = orig
        g_ref = torch.autograd.grad(loss_ref, params)
        r["loss"] = float(loss.detach())
        r["loss_ref"] = float(loss_ref.detach())
        r["grad_err"] = max(rel_norm(a, b) for a, b in zip(g, g_ref))
        # 3. xent.rl.trl_loss against TRL's formula, same log-probs
        if self.xent_loss:
            assert self._xent_loss_applies()    # not TRL's loss in disguise
            self.xent_loss = False
            try:
                loss_trl = super()._compute_loss(model, inputs)
            finally:
                self.xent_loss = True
            g_trl = torch.autograd.grad(loss_trl, params)
            lx, lt = float(loss.detach()), float(loss_trl.detach())
            r["xent_loss_err"] = abs(lx - lt) / max(abs(lt), 1e-30)
            r["xent_loss_grad_err"] = max(rel_norm(a, b)
                                          for a, b in zip(g, g_trl))
        return r


def run(tmp_path, loss_type, xent_loss):
    tok = tokenizer()
    model = tiny_llama(tok)
    prompts = ["the red cat sits on the mat", "a big dog runs",
               "the small sun and the moon", "green blue red"] * 2
    ds = Dataset.from_dict({"prompt": prompts})
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=6, max_steps=2,
        learning_rate=1e-2, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, temperature=TEMP,
        entropy_coef=0.01, loss_type=loss_type, seed=0, bf16=False,
        num_iterations=2,
        dataloader_num_workers=0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    tr = Probe(model=model, args=args, reward_funcs=reward,
               train_dataset=ds, processing_class=tok, xent_loss=xent_loss)
    tr.report = []
    assert getattr(tr.model, "_xent_fused_lm_head", False)
    tr.train()
    changed = [k for k, v in tr.model.named_parameters()
               if not torch.equal(v.detach(), before[k])]
    return tr.report, changed


@pytest.mark.parametrize("loss_type,xent_loss", [("dapo", False),
                                                 ("grpo", True)])
def test_grpo_trainer_uses_xent(tmp_path, loss_type, xent_loss):
    report, changed = run(tmp_path, loss_type, xent_loss)
    print(loss_type, "xent_loss" if xent_loss else "", report)
    assert len(report) == 2                 # one loss step per train step
    for r in report:
        assert r["lp_err"] < 1e-5 and r["ent_err"] < 1e-5, r
        assert abs(r["loss"] - r["loss_ref"]) <= 1e-5 * max(
            abs(r["loss_ref"]), 1e-3), r
        assert r["grad_err"] < 1e-4, r
        if xent_loss:
            assert r["xent_loss_err"] < 1e-5, r
            assert r["xent_loss_grad_err"] < 1e-5, r
    assert "lm_head.weight" in changed, changed
    assert any(k.startswith("model.layers.") for k in changed), changed


def test_apply_patches_trl_trainers(tmp_path):
    """xent.trl.apply(): a plain trl.GRPOTrainer built afterwards scores
    with xent; revert() restores TRL's head."""
    import trl.trainer.grpo_trainer as gt
    tok = tokenizer()
    model = tiny_llama(tok)
    ds = Dataset.from_dict({"prompt": ["the red cat", "a dog"]})
    args = trl.GRPOConfig(output_dir=str(tmp_path),
                          per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=4, max_steps=1,
                          report_to="none", save_strategy="no", use_cpu=True)
    xent.trl.apply()
    try:
        assert gt.add_fused_lm_head is xent.trl.add_fused_lm_head
        tr = trl.GRPOTrainer(model=model, args=args, reward_funcs=reward,
                             train_dataset=ds, processing_class=tok)
        assert getattr(tr.model, "_xent_fused_lm_head", False)
    finally:
        xent.trl.revert()
    assert gt.add_fused_lm_head is xent.trl._TRL_ADD
    # generation and the unfused forward are the model's own
    ids = torch.tensor([[3, 4, 5]])
    out = tr.model(input_ids=ids)
    assert out.logits.shape == (1, 3, len(tok))
