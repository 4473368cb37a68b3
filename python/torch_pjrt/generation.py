"""Text generation for Hugging Face causal LMs in a bounded number of programs.

``model.generate()`` on a lazy device compiles a new program for every new
token: its loop concatenates onto ``input_ids``, the attention mask and the
position ids, and its default cache grows, so every step has new shapes.
:func:`generate` runs the same decoding with every step's shapes fixed:

- the key/value cache is HF's ``StaticCache`` of ``prompt + max_new_tokens``
  slots, written in place at the position the cache itself keeps on the
  device;
- the attention mask has that fixed length from the start (the prompt's
  mask, then ones for the tokens to come): the future slots are hidden by
  causality, the prompt's padding by the mask, exactly what the model reads
  in ``generate()``;
- the position ids, the step counter, the per-row "unfinished" flags and the
  random state are device tensors: their values are data, never constants of
  the program;
- the new tokens are written into a preallocated ``[batch, max_new_tokens]``
  device buffer (no growing ``torch.cat``).

So a call compiles the prefill (one program per prompt shape) and one decode
step program, and a second call with the same shapes compiles nothing.
See docs/generation.md.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Optional, Sequence, Union

import torch

from torch_pjrt import _C, _device

__all__ = ["generate", "process_logits", "sample"]


def process_logits(scores: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                   top_p: Optional[float] = None) -> torch.Tensor:
    """Applies temperature, top-k and top-p to float ``[batch, vocab]`` scores
    as HF's ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
    ``TopPLogitsWarper`` do, in that order (removed tokens get ``-inf``).
    Shapes never depend on the values: every step is the same program.
    Values HF's warpers refuse, and a ``top_p`` above 1, raise ``ValueError``
    (a temperature of 0 would divide the scores into inf and NaN)."""
    _check_sampling(temperature, top_k, top_p)
    if temperature is not None and temperature != 1.0:
        scores = scores / temperature
    vocab = scores.shape[-1]
    if top_k is not None and top_k != 0:
        k = min(max(int(top_k), 1), vocab)
        kth = torch.topk(scores, k)[0][..., -1:]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative <= (1 - top_p)
        sorted_remove[..., -1:] = False  # keep at least one token
        remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, -float("inf"))
    return scores


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy's integers too


def _check_sampling(temperature, top_k, top_p) -> None:
    if temperature is not None and not (isinstance(temperature, numbers.Real) and temperature > 0):
        raise ValueError(f"generate: temperature must be a strictly positive number, got {temperature!r} "
                         f"(for greedy decoding, pass do_sample=False)")
    if top_k is not None and not (_is_int(top_k) and top_k >= 0):
        raise ValueError(f"generate: top_k must be a positive integer (0 or None: no top-k filter), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 <= top_p <= 1):
        raise ValueError(f"generate: top_p must be a number in [0, 1] (1 or None: no top-p filter), got {top_p!r}")


def sample(scores: torch.Tensor) -> torch.Tensor:
    """One token per row, drawn with probability ``softmax(scores)``, with the
    device's random stream (Gumbel-max: ``argmax(scores + Gumbel noise)``,
    exact for any scores, ``-inf`` never drawn). ``[batch]`` int64."""
    u = torch.rand(scores.shape, dtype=torch.float32, device=scores.device)
    u = u.clamp(min=torch.finfo(torch.float32).tiny)  # log(0) would make a -inf tie
    gumbel = -torch.log(-torch.log(u))
    return torch.argmax(scores.float() + gumbel, dim=-1)


def _model_device(model) -> torch.device:
    for p in model.parameters():
        return p.device
    raise ValueError("generate: the model has no parameters to tell its device")


def _seed(device: torch.device, seed: int) -> None:
    """Seeds ``device``'s generator, like ``torch_pjrt.manual_seed`` for one
    device (the seeded state enters programs as data: a new seed compiles
    nothing new)."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    _device.device_count()  # starts the runtime
    _C._manual_seed(device.index, seed)


def _eos_list(eos_token_id) -> list:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, torch.Tensor):
        return [int(x) for x in eos_token_id.reshape(-1).tolist()]
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(x) for x in eos_token_id]


# Generation-config settings that make model.generate() change the scores
# with processors this module does not apply, and their neutral values.
_UNAPPLIED = {
    "repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "sequence_bias": (None,), "min_p": (None,), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0), "exponential_decay_length_penalty": (None,), "num_beams": (None, 1),
}


def _warn_unapplied(gen_config) -> None:
    if gen_config is None:
        return
    found = [f"{k}={getattr(gen_config, k)!r}" for k, neutral in _UNAPPLIED.items()
             if getattr(gen_config, k, None) not in neutral]
    if found:
        import warnings

        warnings.warn(f"torch_pjrt.generation.generate applies temperature, top-k and top-p only; the model's "
                      f"generation config also sets {', '.join(found)}, which model.generate() would apply: "
                      f"the tokens may differ from model.generate()'s.", stacklevel=3)


# Attention that cuts its causal mask from a buffer by the keys' length
# (bias[key_len - query_len:key_len]): with a static cache the keys' length
# is the cache's, so the cut is wrong (on the CPU too, as with
# cache_implementation="static"); model.generate() grows its cache instead.
# By the modeling module: Bark's generating models have other model_types.
_MASK_CUT_BY_KEY_LENGTH = ("modeling_gpt_neo", "modeling_imagegpt", "modeling_bark")


# Models whose forward takes a cache of their own kind, not a transformers
# Cache (XLM's dict of past states).
_OWN_CACHE = ("modeling_xlm",)


def _no_kv_cache(model) -> NotImplementedError:
    """OpenAI GPT, XLNet, XLM: each step reads the whole sequence, so the
    static cache would be ignored and a step's one token meet the full mask."""
    return NotImplementedError(
        f"torch_pjrt.generation.generate does not support {type(model).__name__}: it keeps no key-value cache that "
        f"a static cache can stand for, so each step would have to encode the whole sequence again. Use "
        f"model.generate() for it.")


def _check_supported(model, max_len: int) -> None:
    """Refuses models whose decoding this fixed-shape loop cannot repeat."""
    config = getattr(model, "config", None)
    params = set(inspect.signature(inspect.unwrap(type(model).forward)).parameters)
    if type(model).__module__.rsplit(".", 1)[-1] in _OWN_CACHE or not {"cache", "past_key_values", "use_cache"} & params:
        raise _no_kv_cache(model)
    if type(model).__module__.rsplit(".", 1)[-1] in _MASK_CUT_BY_KEY_LENGTH:
        raise NotImplementedError(
            f"torch_pjrt.generation.generate does not support {type(model).__name__}: its attention cuts the causal "
            f"mask by the keys' length, which a static cache makes the cache's length (the tokens would differ). Use "
            f"model.generate() for it.")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "longrope":
        original = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings",
                                                                            None)
        if original is not None and max_len > original:
            raise NotImplementedError(
                f"torch_pjrt.generation.generate: {type(model).__name__} switches to its long RoPE factors past "
                f"{original} tokens and model.generate() then encodes the whole sequence again, which this loop does "
                f"not; prompt + max_new_tokens is {max_len}. Use model.generate() for it, or stay within {original}.")


def _static_cache(model, max_len: int):
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=max_len)
    for layer in cache.layers:
        if type(layer) is not StaticLayer:
            raise NotImplementedError(
                f"torch_pjrt.generation.generate supports models whose layers all use full attention; this model's "
                f"static cache has a {type(layer).__name__} (sliding-window, chunked or linear attention keeps "
                f"data-dependent state). Use model.generate() for it.")
    return cache


def _default_new_tokens(model, prompt_len: int) -> int:
    """How many tokens model.generate() makes when not told: the generation
    config's max_new_tokens; else its max_length, prompt included, unless
    that is GenerationConfig's own default (None since transformers 5, 20
    before), which means 20 new tokens, fewer where the model's positions
    end first."""
    gen_config = getattr(model, "generation_config", None)
    n = getattr(gen_config, "max_new_tokens", None)
    if n is not None:
        return n
    total = getattr(gen_config, "max_length", None)
    from transformers import GenerationConfig

    if total is None or total == GenerationConfig().max_length:
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        return 20 if positions is None else max(1, min(20, positions - prompt_len))
    if total <= prompt_len:
        raise ValueError(f"generate: the prompt has {prompt_len} tokens and the model's generation_config.max_length "
                         f"is {total} (prompt included): nothing is left to generate. Pass max_new_tokens")
    return total - prompt_len


def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    max_new_tokens: Optional[int] = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: Optional[int] = 50,
    top_p: Optional[float] = 1.0,
    eos_token_id: Union[int, Sequence[int], None] = None,
    pad_token_id: Optional[int] = None,
    seed: Optional[int] = None,
    stop_check_interval: int = 8,
    length_bucket: Optional[int] = None,
) -> torch.Tensor:
    """Greedy or sampled decoding of a HF causal LM on a pjrt device.

    Returns ``[batch, prompt + n]`` token ids like ``model.generate()``:
    the prompt, then ``n <= max_new_tokens`` new tokens (default, as
    ``model.generate()``: the model's ``generation_config.max_new_tokens``,
    else its ``max_length`` minus the prompt where that is set, else 20);
    ``n`` is shorter
    only when every row produced an end-of-sequence token, and rows that
    finished earlier are filled with ``pad_token_id`` (default: the first eos
    id), as ``model.generate()`` does. Greedy decoding gives
    ``model.generate()``'s tokens. Sampling (``do_sample=True``) draws on
    the device's random stream: reproducible under ``seed`` (which reseeds
    the device generator, as ``torch_pjrt.manual_seed`` does), but not the
    CPU's stream. ``temperature``, ``top_k`` and ``top_p`` work as in
    ``model.generate()``, with its defaults (``top_k=50``); they are not read
    from the model's generation config, and no other logits processor is
    applied (a generation config that asks for one gets a warning).

    ``input_ids`` may be left-padded, with ``attention_mask`` zero on the
    padding (padding on the right raises a ValueError); without a mask,
    the padding is where the prompt holds ``pad_token_id`` (unless that is
    an end-of-sequence id), as ``model.generate()`` infers it. ``eos_token_id`` / ``pad_token_id`` default to the model's
    generation config. Every ``stop_check_interval`` tokens the loop reads
    one number back from the device (a wait) to stop once every row has
    finished; 0 never stops early.

    The programs depend on the batch size, the prompt length and
    ``max_new_tokens``. With ``length_bucket=b`` the prompt is left-padded
    (masked, as a tokenizer pads) to a multiple of ``b`` and the cache holds
    a multiple of ``b`` tokens, so that prompts and ``max_new_tokens`` within
    the same buckets share their programs.
    """
    if type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        # torch.compile(model): the loop's two programs are compiled once
        # anyway; it calls the module itself.
        model = model._orig_mod
    if input_ids.dim() != 2:
        raise ValueError(f"generate: input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"generate: input_ids must be token ids (int64 or int32), got {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("generate: the prompt is empty (input_ids of length 0); give at least one token, e.g. the "
                         "model's bos_token_id")
    if max_new_tokens is None:
        max_new_tokens = _default_new_tokens(model, input_ids.shape[1])
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be an integer of at least 1, got {max_new_tokens!r}")
    if not _is_int(stop_check_interval) or stop_check_interval < 0:
        raise ValueError(f"generate: stop_check_interval must be an integer >= 0 (0: never stop early), got "
                         f"{stop_check_interval!r}")
    if do_sample:
        _check_sampling(temperature, top_k, top_p)
    max_new_tokens, stop_check_interval = int(max_new_tokens), int(stop_check_interval)
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise NotImplementedError(
            f"generate: {type(model).__name__} is an encoder-decoder model; torch_pjrt.generation.generate decodes "
            "causal (decoder-only) LMs. Use model.generate() for it (it runs on pjrt, compiling per new length).")
    device = _model_device(model)
    if device.type != "pjrt":
        raise ValueError(f"generate: the model is on {device}; move it to a pjrt device first (model.to('pjrt'))")
    if device.index is None:
        device = torch.device("pjrt", _C._current_device())
    gen_config = getattr(model, "generation_config", None)
    if eos_token_id is None and gen_config is not None:
        eos_token_id = gen_config.eos_token_id
    if pad_token_id is None and gen_config is not None:
        pad_token_id = gen_config.pad_token_id
    eos = _eos_list(eos_token_id)
    _warn_unapplied(gen_config)
    if pad_token_id is None and eos:
        pad_token_id = eos[0]

    if seed is not None:
        _seed(device, seed)

    if length_bucket is not None and (not _is_int(length_bucket) or length_bucket < 1):
        raise ValueError(f"generate: length_bucket must be a positive number of tokens, got {length_bucket!r}")
    length_bucket = int(length_bucket) if length_bucket is not None else None

    batch, prompt_len = input_ids.shape
    out_device = input_ids.device
    # The prompt is made on the host and uploaded once: its padding to a
    # bucket must not be an op of the first program (whose shapes would then
    # depend on the unpadded length).
    ids = input_ids.to(device="cpu", dtype=torch.long)
    if attention_mask is None:
        # As model.generate() infers it: where the prompt holds the pad id
        # and that is no end-of-sequence id, the other tokens; else all.
        padding = ids.eq(pad_token_id) if pad_token_id is not None and pad_token_id not in eos else None
        if padding is not None and bool(padding.any()):
            prompt_mask = (~padding).long()
        else:
            prompt_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    else:
        if tuple(attention_mask.shape) != (batch, prompt_len):
            raise ValueError(f"generate: attention_mask has shape {tuple(attention_mask.shape)}, "
                             f"input_ids {tuple(input_ids.shape)}: they must match")
        prompt_mask = attention_mask.to(device="cpu", dtype=torch.long)
    # Tokens follow the prompt's last position: padding on the right would
    # sit between the prompt and what is generated from it.
    right = (prompt_mask[:, :-1] > prompt_mask[:, 1:]).any(-1).nonzero().flatten().tolist()
    if right:
        raise ValueError(f"generate: the prompt of row {right[0]} is padded on the right (its attention mask has a 0 "
                         "after a 1); pad prompts on the left (a tokenizer's padding_side='left'), as decoder-only "
                         "generation needs")
    padded_len, max_len = prompt_len, prompt_len + max_new_tokens
    if length_bucket:
        padded_len = -(-prompt_len // length_bucket) * length_bucket
        max_len = -(-(padded_len + max_new_tokens) // length_bucket) * length_bucket
        # more left padding, which the mask hides from the model
        ids = torch.nn.functional.pad(ids, (padded_len - prompt_len, 0))
        prompt_mask = torch.nn.functional.pad(prompt_mask, (padded_len - prompt_len, 0))
    slots = max_len - padded_len  # >= max_new_tokens
    # The mask of every step: the prompt's, then the tokens to come. Slots not
    # written yet are hidden by causality (the query's position), not by it.
    mask = torch.cat([prompt_mask, torch.ones(batch, slots, dtype=torch.long)], dim=-1)
    # Positions as model.generate() makes them: counting the prompt's real tokens.
    positions = (prompt_mask.cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)
    next_position = prompt_mask.sum(-1, keepdim=True)  # [batch, 1]
    prompt_ids = ids
    ids, mask, positions, next_position = (t.to(device) for t in (ids, mask, positions, next_position))

    _check_supported(model, max_len)
    cache = _static_cache(model, max_len)
    forward_kwargs = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        forward_kwargs["logits_to_keep"] = 1

    eos_ids = torch.tensor(eos, dtype=torch.long, device=device) if eos else None
    # a tensor, not a Python number: 0 and 1 would be program constants, other ids data
    pad = torch.tensor(int(pad_token_id) if pad_token_id is not None else 0, dtype=torch.long, device=device)
    tokens = torch.zeros(batch, slots, dtype=torch.long, device=device)
    columns = torch.arange(slots, dtype=torch.long, device=device)
    step = torch.zeros((), dtype=torch.long, device=device)
    unfinished = torch.ones(batch, dtype=torch.long, device=device)
    remaining = None

    def choose(logits: torch.Tensor) -> torch.Tensor:
        scores = logits[:, -1, :].to(torch.float32)
        if do_sample:
            return sample(process_logits(scores, temperature, top_k, top_p))
        return torch.argmax(scores, dim=-1)

    def emit(next_tokens: torch.Tensor) -> torch.Tensor:
        """Writes the step's tokens at column `step`, updates the stop flags;
        returns the tokens the next step reads."""
        nonlocal tokens, unfinished, remaining, step
        if eos_ids is not None:
            next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
            hit = (next_tokens[:, None] == eos_ids[None, :]).any(dim=-1)
            unfinished = unfinished * (~hit).long()
            # part of every step's program, so that reading it compiles nothing
            remaining = unfinished.sum()
        # one-hot of the column: the step's position is data, not an index constant
        here = (columns == step).long()[None, :]
        tokens = tokens * (1 - here) + next_tokens[:, None] * here
        step = step + 1
        return next_tokens[:, None]

    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                    **forward_kwargs)
        if getattr(out, "cache", None) is None:  # it ignored the static cache
            raise _no_kv_cache(model)
        next_ids = emit(choose(out.logits))
        del out
        _device.sync(devices=[device])
        produced = 1
        while produced < max_new_tokens:
            if eos_ids is not None and stop_check_interval and produced % stop_check_interval == 0:
                if int(remaining.item()) == 0:
                    break
            pos = next_position + (step - 1)
            out = model(input_ids=next_ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                        **forward_kwargs)
            next_ids = emit(choose(out.logits))
            del out
            _device.sync(devices=[device])
            produced += 1

    new = tokens.cpu()[:, :produced]
    if eos:
        # model.generate() stops at the step where the last row finished
        hit = torch.zeros_like(new, dtype=torch.bool)
        for e in eos:
            hit |= new == e
        finished_at = torch.where(hit.any(-1), hit.int().argmax(-1) + 1, torch.full((batch,), produced))
        produced = int(finished_at.max())
        new = new[:, :produced]
    return torch.cat([prompt_ids[:, padded_len - prompt_len:], new], dim=-1).to(out_device)
