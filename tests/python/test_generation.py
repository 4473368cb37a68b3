"""torch_pjrt.generation.generate: the tokens of HF's model.generate() on the
CPU (greedy, left padding, eos per row; GPT-2, Llama with GQA and RoPE,
Mistral), a number of compiled programs that does not grow with the number
of new tokens and is 0 on a second call, and sampling on the device's random
stream (top_k=1 is greedy, a seed reproduces, draws follow softmax).

Tiny random models (vocab 128, hidden 32, 2 layers). A program's count
depends on the shapes, so each count below uses a prompt shape no other test
of this process uses."""

from __future__ import annotations

import pytest
import torch

import torch_pjrt
from torch_pjrt import generation, metrics

import transformers  # noqa: E402  (a test dependency: requirements.txt)

VOCAB = 128


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM, cfg


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                  eos_token_id=None, bos_token_id=None)
    return transformers.GPT2LMHeadModel, cfg


def _mistral():
    cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                     sliding_window=None, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return transformers.MistralForCausalLM, cfg


def _granite_moe():
    # takes use_cache through **kwargs (a check of forward's named parameters refused it)
    cfg = transformers.GraniteMoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2,
                                        num_experts_per_tok=1, max_position_embeddings=256, eos_token_id=None,
                                        bos_token_id=None, pad_token_id=None)
    return transformers.GraniteMoeForCausalLM, cfg


FAMILIES = {"llama": _llama, "gpt2": _gpt2, "mistral": _mistral, "granite_moe": _granite_moe}
_models = {}


def models(family):
    """(CPU model, the same weights on pjrt), built once per process."""
    if family not in _models:
        cls, cfg = FAMILIES[family]()
        torch.manual_seed(0)
        cpu = cls(cfg).eval()
        dev = cls(cfg).eval()
        dev.load_state_dict(cpu.state_dict())
        _models[family] = (cpu, dev.to(torch_pjrt.device()))
    return _models[family]


def prompt(batch, length, left_pad=(), seed=0):
    """Token ids and attention mask; row i gets left_pad[i] padding tokens (id 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate(left_pad):
        ids[row, :n] = 0
        mask[row, :n] = 0
    return ids, mask


def hf_generate(model, ids, mask=None, **kw):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                              do_sample=False, pad_token_id=kw.pop("pad_token_id", 0), **kw)


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "granite_moe"])
def test_greedy_matches_cpu_generate_with_left_padding(family):
    cpu, dev = models(family)
    ids, mask = prompt(3, 6, left_pad=(0, 2, 5))
    want = hf_generate(cpu, ids, mask, max_new_tokens=10)
    got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    assert got.device.type == "cpu"
    assert torch.equal(got, want)


def test_greedy_matches_cpu_generate_without_mask_and_on_device_inputs():
    cpu, dev = models("llama")
    ids, _ = prompt(1, 5, seed=1)
    want = hf_generate(cpu, ids, max_new_tokens=7)
    assert torch.equal(generation.generate(dev, ids, max_new_tokens=7), want)
    got = generation.generate(dev, ids.to(torch_pjrt.device()), max_new_tokens=7)
    assert got.device.type == "pjrt"  # returned where the prompt was
    assert torch.equal(got.cpu(), want)


def test_eos_stops_each_row_and_pads_it_as_cpu_generate_does():
    cpu, dev = models("llama")
    ids, mask = prompt(3, 6, left_pad=(0, 1, 3), seed=2)
    free = hf_generate(cpu, ids, mask, max_new_tokens=10)[:, 6:]
    eos = int(free[0, 2])  # row 0 ends at its third token; the others when (if) they meet it
    pad = 1 if eos != 1 else 2
    want = hf_generate(cpu, ids, mask, max_new_tokens=10, eos_token_id=eos, pad_token_id=pad)
    got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=10, eos_token_id=eos,
                              pad_token_id=pad, stop_check_interval=4)
    assert torch.equal(got, want)
    assert (got[0, 6 + 3:] == pad).all()
    # all rows finished: both stop early, at the same step
    row_eos = [int(free[r, 0]) for r in range(3)]
    want = hf_generate(cpu, ids, mask, max_new_tokens=10, eos_token_id=row_eos, pad_token_id=pad)
    got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=10, eos_token_id=row_eos,
                              pad_token_id=pad)
    assert want.shape[1] < 6 + 10
    assert torch.equal(got, want)


def _count(fn):
    metrics.reset()
    out = fn()
    return out, metrics.counters().get("compiles", 0), metrics.fallbacks()


def test_programs_do_not_grow_with_new_tokens_and_a_second_call_compiles_none():
    _, dev = models("gpt2")
    ids, mask = prompt(2, 9, left_pad=(0, 3), seed=3)
    _, few, _ = _count(lambda: generation.generate(dev, ids, attention_mask=mask, max_new_tokens=3))
    _, many, _ = _count(lambda: generation.generate(dev, ids, attention_mask=mask, max_new_tokens=24))
    assert many == few  # same programs for other lengths: one prefill, one decode step
    _, warm, _ = _count(lambda: generation.generate(dev, ids, attention_mask=mask, max_new_tokens=24))
    assert warm == 0
    assert not any("changed" in r["why"] and "constant" in r["why"] for r in metrics.recompiles())


def test_64_tokens_compile_a_handful_of_programs_cold_and_none_warm():
    _, dev = models("llama")
    ids, mask = prompt(2, 11, left_pad=(4, 0), seed=4)
    run = lambda: generation.generate(dev, ids, attention_mask=mask, max_new_tokens=64)  # noqa: E731
    out, cold, fallbacks = _count(run)
    again, warm, _ = _count(run)
    assert out.shape == (2, 11 + 64) and torch.equal(out, again)
    assert warm == 0
    assert fallbacks == {}
    # the prefill (split twice by HF's mask code reading the cache position), one decode step
    assert cold <= 5


def test_inference_mode():
    cpu, dev = models("llama")
    ids, mask = prompt(3, 6, left_pad=(0, 2, 5))
    want = hf_generate(cpu, ids, mask, max_new_tokens=10)
    with torch.inference_mode():
        got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(got, want)


def test_sampling_top_k_1_is_greedy():
    cpu, dev = models("llama")
    ids, mask = prompt(3, 6, left_pad=(0, 2, 5))
    want = hf_generate(cpu, ids, mask, max_new_tokens=10)
    got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0, do_sample=True,
                              top_k=1, temperature=0.5, seed=11)
    assert torch.equal(got, want)


def test_sampling_reproduces_under_a_seed_and_a_new_seed_does_not_recompile():
    _, dev = models("llama")
    ids, mask = prompt(3, 6, left_pad=(0, 2, 5))
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=True, temperature=1.5, top_k=40, top_p=0.95)
    first = generation.generate(dev, ids, seed=5, **kw)
    metrics.reset()
    second = generation.generate(dev, ids, seed=5, **kw)
    other = generation.generate(dev, ids, seed=6, **kw)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)
    assert metrics.counters().get("compiles", 0) == 0


def test_sampled_tokens_follow_softmax():
    dev = torch_pjrt.device()
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -0.5])
    p = logits.softmax(-1)
    n = 2000
    torch_pjrt.manual_seed(1234)
    draws = generation.sample(logits.to(dev).expand(n, 6).contiguous()).cpu()
    counts = torch.bincount(draws, minlength=6).double()
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 30.0, (counts / n, p)  # 5 degrees of freedom: p-value about 1.5e-5
    # a -inf score is never drawn
    masked = logits.masked_fill(torch.tensor([False, True, False, True, True, True]), -float("inf"))
    draws = generation.sample(masked.to(dev).expand(500, 6).contiguous()).cpu()
    assert set(draws.tolist()) <= {0, 2}


def test_logits_processing_matches_hf_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(7)
    scores = torch.randn(4, VOCAB, generator=g)
    for temperature, top_k, top_p in [(0.7, 20, 0.8), (1.0, None, 0.5), (1.3, 5, None), (1.0, 0, 1.0)]:
        want = scores.clone()
        if temperature != 1.0:
            want = TemperatureLogitsWarper(temperature)(None, want)
        if top_k:
            want = TopKLogitsWarper(top_k)(None, want)
        if top_p is not None and top_p < 1.0:
            want = TopPLogitsWarper(top_p)(None, want)
        got = generation.process_logits(scores.to(torch_pjrt.device()), temperature, top_k, top_p).cpu()
        assert torch.equal(torch.isinf(got), torch.isinf(want)), (temperature, top_k, top_p)
        torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)])


def test_refuses_a_cpu_model_a_sliding_window_cache_and_an_encoder_decoder():
    cpu, _ = models("llama")
    ids, _ = prompt(1, 4)
    with pytest.raises(ValueError, match="pjrt"):
        generation.generate(cpu, ids, max_new_tokens=2)
    cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=1, sliding_window=4)
    model = transformers.MistralForCausalLM(cfg).eval().to(torch_pjrt.device())
    with pytest.raises(NotImplementedError, match="StaticSlidingWindowLayer"):
        generation.generate(model, ids, max_new_tokens=2)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)).to(torch_pjrt.device())
    with pytest.raises(NotImplementedError, match="encoder-decoder model.*model.generate"):
        generation.generate(t5, ids, max_new_tokens=2)
    # no key-value cache: the static cache was ignored and the step failed in the model's own code
    gpt = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(
        vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32)).eval().to(torch_pjrt.device())
    with pytest.raises(NotImplementedError, match="keeps no key-value cache.*model.generate"):
        generation.generate(gpt, ids, max_new_tokens=2)


def test_bad_arguments_raise_as_hf_does_and_a_compiled_model_generates():
    """Sampling settings HF's generate() refuses (temperature 0 divided the
    scores into NaN; a negative top_k or top_p quietly became greedy) raise
    ValueError; so do a float token count, a negative check interval, float
    ids, an empty prompt and a prompt padded on the right. torch.compile(model) generates the tokens of
    the module it wraps."""
    cpu, dev = models("llama")
    ids, mask = prompt(2, 5, left_pad=(0, 1), seed=4)
    for kw, match in ((dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
                      (dict(top_k=-3), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=-0.5), "top_p"),
                      (dict(top_p=1.5), "top_p")):
        with pytest.raises(ValueError, match=match):
            generation.generate(dev, ids, max_new_tokens=2, do_sample=True, **kw)
        with pytest.raises(ValueError, match=match):
            generation.process_logits(torch.zeros(1, VOCAB), **{"temperature": 1.0, **kw})
    for kw, match in ((dict(max_new_tokens=3.5), "max_new_tokens"), (dict(stop_check_interval=-1), "stop_check"),
                      (dict(length_bucket=0), "length_bucket")):
        with pytest.raises(ValueError, match=match):
            generation.generate(dev, ids, **{"max_new_tokens": 2, **kw})
    with pytest.raises(TypeError, match="token ids"):
        generation.generate(dev, ids.float(), max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt is empty"):
        generation.generate(dev, ids[:, :0], max_new_tokens=2)
    # padding on the right would sit between the prompt and its tokens
    # (HF warns and generates after the padding); the inferred mask too
    right = torch.ones_like(mask)
    right[1, -2:] = 0
    with pytest.raises(ValueError, match="row 1 is padded on the right"):
        generation.generate(dev, ids, attention_mask=right, max_new_tokens=2)
    with pytest.raises(ValueError, match="row 0 is padded on the right"):
        generation.generate(dev, torch.tensor([[5, 6, 0]]), max_new_tokens=2, pad_token_id=0)
    import numpy as np
    got = generation.generate(dev, ids, attention_mask=mask, max_new_tokens=np.int64(4), pad_token_id=0,
                              stop_check_interval=np.int32(2))
    assert torch.equal(got, hf_generate(cpu, ids, mask, max_new_tokens=4))
    compiled = torch.compile(dev, backend="pjrt")
    got = generation.generate(compiled, ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0)
    assert torch.equal(got, hf_generate(cpu, ids, mask, max_new_tokens=4))


def test_refuses_a_mask_cut_by_the_keys_length_and_long_rope_past_its_switch():
    # both would give other tokens than model.generate() (found against it:
    # GPT-Neo's local attention cuts its mask by the cache's length; Phi-3
    # encodes the whole sequence again with its long factors)
    ids, _ = prompt(1, 8)
    neo = transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=8, max_position_embeddings=64)).eval().to(torch_pjrt.device())
    with pytest.raises(NotImplementedError, match="cuts the causal mask.*model.generate"):
        generation.generate(neo, ids.to(torch_pjrt.device()), max_new_tokens=2)
    factors = [1.0] * 4
    phi = transformers.Phi3ForCausalLM(transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=12, pad_token_id=0,
        rope_scaling={"type": "longrope", "short_factor": factors, "long_factor": factors})).eval()
    phi = phi.to(torch_pjrt.device())
    with pytest.raises(NotImplementedError, match="long RoPE factors past 12 tokens"):
        generation.generate(phi, ids.to(torch_pjrt.device()), max_new_tokens=12)
    assert generation.generate(phi, ids.to(torch_pjrt.device()), max_new_tokens=4).shape == (1, 12)  # within 12


def test_warns_when_the_generation_config_asks_for_processors_it_does_not_apply():
    _, dev = models("llama")
    ids, _ = prompt(3, 6)
    dev.generation_config.repetition_penalty = 1.3
    try:
        with pytest.warns(UserWarning, match="repetition_penalty=1.3"):
            generation.generate(dev, ids, max_new_tokens=2)
    finally:
        dev.generation_config.repetition_penalty = None


def test_max_new_tokens_defaults_to_the_generation_configs():
    _, dev = models("llama")
    ids, _ = prompt(1, 4)
    dev.generation_config.max_new_tokens = 3
    try:
        assert generation.generate(dev, ids).shape == (1, 7)
    finally:
        dev.generation_config.max_new_tokens = None
    assert generation.generate(dev, ids).shape == (1, 24)  # else 20, as before
    # else its max_length, prompt included, as model.generate() reads it
    cpu, _ = models("llama")
    saved = dev.generation_config.max_length, cpu.generation_config.max_length
    try:
        for total in (9, 20):
            dev.generation_config.max_length = cpu.generation_config.max_length = total
            assert generation.generate(dev, ids).shape == hf_generate(cpu, ids).shape
        with pytest.raises(ValueError, match="nothing is left to generate"):
            generation.generate(dev, prompt(1, 20)[0])
    finally:
        dev.generation_config.max_length, cpu.generation_config.max_length = saved


def test_without_a_mask_padding_is_inferred_from_the_pad_id_as_generate_does():
    """A left-padded prompt without attention_mask: model.generate() masks
    the tokens equal to pad_token_id (when that is no eos id); the helper
    took the whole prompt as tokens."""
    cpu, dev = models("llama")
    ids, _ = prompt(2, 6, left_pad=(0, 3))
    with torch.no_grad():
        want = cpu.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(generation.generate(dev, ids, max_new_tokens=6, pad_token_id=0), want)


def test_length_buckets_share_programs_across_prompt_lengths_and_token_counts():
    cpu, dev = models("gpt2")
    first, first_mask = prompt(2, 5, left_pad=(1, 0), seed=8)
    second, second_mask = prompt(2, 7, left_pad=(0, 2), seed=9)
    want = hf_generate(cpu, first, first_mask, max_new_tokens=6)
    got = generation.generate(dev, first, attention_mask=first_mask, max_new_tokens=6, length_bucket=16,
                              pad_token_id=0)
    assert torch.equal(got, want)
    want = hf_generate(cpu, second, second_mask, max_new_tokens=9)
    metrics.reset()  # prompt 7 and 9 new tokens: the same buckets (16, 32) as prompt 5 and 6 new tokens
    got = generation.generate(dev, second, attention_mask=second_mask, max_new_tokens=9, length_bucket=16,
                              pad_token_id=0)
    assert metrics.counters().get("compiles", 0) == 0
    assert torch.equal(got, want)
