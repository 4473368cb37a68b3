"""Text generation on pjrt: programs compiled and time per new token, for
HF's ``model.generate()`` (default dynamic cache, and
``cache_implementation="static"``) and for ``torch_pjrt.generation.generate``,
against ``model.generate()`` on the CPU. Greedy decoding of a small random
Llama (GQA, RoPE); the tokens of every pjrt run are checked against the CPU's.

    python bench/generation.py [--new-tokens 32] [--hidden 32] [--skip-plain]

"cold" is the first call in a fresh process (compiles included); "warm" the
fastest of the next calls with the same prompt shape. Numbers are only comparable within
one run on one machine (docs/generation.md quotes one).
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_pjrt
from torch_pjrt import generation, metrics


def build(hidden: int, layers: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    return cfg, LlamaForCausalLM(cfg).eval()


def timed(fn):
    metrics.reset()
    t0 = time.perf_counter()
    out = fn()
    out = out.cpu()
    return out, time.perf_counter() - t0, metrics.counters().get("compiles", 0), metrics.fallbacks()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="warm calls; the fastest is reported")
    ap.add_argument("--skip-plain", action="store_true", help="skip model.generate() on pjrt (slow to compile)")
    args = ap.parse_args()
    n = args.new_tokens

    cfg, cpu_model = build(args.hidden, args.layers, args.vocab)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # one left-padded row
    ids[0, :2] = 0
    # no end-of-sequence token: every run makes exactly n tokens
    cpu_model.generation_config.eos_token_id = None
    kw = dict(attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)

    with torch.no_grad():
        ref = cpu_model.generate(ids, **kw)
        cpu_s = min(timed(lambda: cpu_model.generate(ids, **kw))[1] for _ in range(args.repeat))

    dev = torch_pjrt.device()
    _, model = build(args.hidden, args.layers, args.vocab)
    model.load_state_dict(cpu_model.state_dict())
    model.generation_config.eos_token_id = None
    model.to(dev)

    rows = [("model.generate(), CPU", None, None, cpu_s, True, {})]

    def run(name, fn):
        out, cold_s, cold_c, fb = timed(fn)
        warm = [timed(fn) for _ in range(args.repeat)]
        warm_s, warm_c = min(w[1] for w in warm), max(w[2] for w in warm)
        same = torch.equal(out, ref) and all(torch.equal(w[0], ref) for w in warm)
        rows.append((name, cold_c, warm_c, warm_s, same, fb))
        print(f"  {name}: cold {cold_s:.1f} s", flush=True)

    if not args.skip_plain:
        with torch.no_grad():
            run("model.generate(), pjrt, dynamic cache",
                lambda: model.generate(ids.to(dev), attention_mask=mask.to(dev), **{k: v for k, v in kw.items()
                                                                                   if k != "attention_mask"}))
            run("model.generate(), pjrt, static cache",
                lambda: model.generate(ids.to(dev), attention_mask=mask.to(dev), cache_implementation="static",
                                       **{k: v for k, v in kw.items() if k != "attention_mask"}))
    run("torch_pjrt.generation.generate, pjrt",
        lambda: generation.generate(model, ids, attention_mask=mask, max_new_tokens=n))

    print(f"\nLlama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, batch {args.batch}, "
          f"prompt {args.prompt}, {n} new tokens, greedy")
    print(f"{'':44} {'compiles cold':>13} {'compiles warm':>13} {'ms/token warm':>13}  tokens == CPU")
    for name, cc, wc, s, same, fb in rows:
        c1 = "" if cc is None else str(cc)
        c2 = "" if wc is None else str(wc)
        print(f"{name:44} {c1:>13} {c2:>13} {s / n * 1e3:>13.2f}  {same}")
    for name, _, _, _, _, fb in rows:
        if fb:
            print(f"CPU fallbacks in {name} (one call): {dict(sorted(fb.items()))}")


if __name__ == "__main__":
    main()
