"""The model zoo: common families of Hugging Face `transformers` and of vision
classifiers, from small configs with random init, trained on the CPU (eager,
the oracle) and on pjrt from the same weights and data.

The vision classifiers are written here, block by block as torchvision and
timm write them (ResNet basic blocks, MobileNetV3 inverted residuals with
squeeze-excite and hardswish, EfficientNet MBConv with SiLU, ConvNeXt blocks
with channels-last LayerNorm and layer scale, Swin shifted-window attention
with a relative position bias): the PyPI torchvision wheel is a CUDA build
whose compiled ops do not load with the CPU torch wheel, and a broken
torchvision also breaks `import transformers`.

`run(name, device, ...)` trains one family for a few AdamW steps and returns
its losses; `tests/python/test_models.py` (a subset, in `make test`) and
`make models` (every family, mode and dtype) compare them with the CPU and
assert that nothing fell back.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 128


# ------------------------------------------------------------------ vision


class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=1, groups=1, act: Optional[Callable[[], nn.Module]] = nn.ReLU):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(ConvBN(cin, cout, 3, stride), ConvBN(cout, cout, 3, act=None))
        self.down = ConvBN(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.body(x) + self.down(x))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 16, 3, 1), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2))
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze, gate: Callable[[], nn.Module], act: Callable[[], nn.Module] = nn.ReLU):
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.act = act()
        self.gate = gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block (hardswish, squeeze-excite with hardsigmoid) or
    EfficientNet's MBConv (SiLU, squeeze-excite with sigmoid)."""

    def __init__(self, cin, cout, expand, k, stride, act, gate, se=True):
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [ConvBN(cin, mid, 1, act=act)] if expand != 1 else []
        layers += [ConvBN(mid, mid, k, stride, groups=mid, act=act)]
        if se:
            layers.append(SqueezeExcite(mid, max(mid // 4, 8), gate, act=nn.ReLU if gate is nn.Hardsigmoid else nn.SiLU))
        layers.append(ConvBN(mid, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV3(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        hs, rl, hsig = nn.Hardswish, nn.ReLU, nn.Hardsigmoid
        self.features = nn.Sequential(
            ConvBN(3, 16, 3, 2, act=hs),
            InvertedResidual(16, 16, 1, 3, 2, rl, hsig, se=True),
            InvertedResidual(16, 24, 4, 3, 2, rl, hsig, se=False),
            InvertedResidual(24, 24, 3, 5, 1, hs, hsig, se=True),
            ConvBN(24, 48, 1, act=hs),
        )
        self.head = nn.Sequential(nn.Linear(48, 64), nn.Hardswish(), nn.Dropout(0.0), nn.Linear(64, classes))

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class EfficientNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            ConvBN(3, 16, 3, 2, act=nn.SiLU),
            InvertedResidual(16, 16, 1, 3, 1, nn.SiLU, nn.Sigmoid),
            InvertedResidual(16, 24, 6, 3, 2, nn.SiLU, nn.Sigmoid),
            InvertedResidual(24, 24, 6, 5, 1, nn.SiLU, nn.Sigmoid),
            ConvBN(24, 64, 1, act=nn.SiLU),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's downsampling)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6))
        self.stage1 = ConvNeXtBlock(16)
        self.down = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Conv2d(16, 32, 2, 2))
        self.stage2 = ConvNeXtBlock(32)
        self.norm = nn.LayerNorm(32, eps=1e-6)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean((-2, -1))))


def window_partition(x, w):
    b, h, wd, c = x.shape
    x = x.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, w * w, c)


def window_reverse(x, w, h, wd):
    b = x.shape[0] // ((h // w) * (wd // w))
    x = x.view(b, h // w, wd // w, w, w, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, wd, -1)


class WindowAttention(nn.Module):
    """Swin's (shifted) window attention with a learned relative position bias."""

    def __init__(self, c, heads, window, shift, resolution):
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("rel_index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)
        mask = None
        if shift:
            h = wd = resolution
            region = torch.zeros(1, h, wd, 1)
            cnt = 0
            for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                    region[:, hs, ws, :] = cnt
                    cnt += 1
            win = window_partition(region, window).squeeze(-1)
            diff = win[:, None, :] - win[:, :, None]
            mask = diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x):
        b, h, wd, c = x.shape
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = window_partition(x, self.window)
        n = win.shape[1]
        qkv = self.qkv(win).reshape(-1, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.bias_table[self.rel_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        attn = attn + bias.unsqueeze(0)
        if self.attn_mask is not None:
            nw = self.attn_mask.shape[0]
            attn = attn.view(-1, nw, self.heads, n, n) + self.attn_mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, n, c)
        x = window_reverse(self.proj(out), self.window, h, wd)
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x


class SwinBlock(nn.Module):
    def __init__(self, c, heads, window, shift, resolution):
        super().__init__()
        self.norm1 = nn.LayerNorm(c)
        self.attn = WindowAttention(c, heads, window, shift, resolution)
        self.norm2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 2 * c), nn.GELU(), nn.Linear(2 * c, c))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 2, 2)
        self.blocks = nn.Sequential(SwinBlock(32, 4, 4, 0, 8), SwinBlock(32, 4, 4, 2, 8))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = self.blocks(self.patch(x).permute(0, 2, 3, 1))
        return self.head(self.norm(x.mean((1, 2))))


VISION = {"resnet": ResNet, "mobilenetv3": MobileNetV3, "efficientnet": EfficientNet, "convnext": ConvNeXt,
          "swin": Swin}

# ------------------------------------------------------------ transformers


def _hf_model(name: str):
    import transformers as T

    small = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    # Dropout off: its masks come from each device's own random stream, so
    # they differ from the CPU's (tests/python/test_rng_checkpointing.py
    # covers dropout on pjrt).
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_positions=64, n_embd=32, n_layer=2, n_head=4, **small))
    if name == "bert":
        return T.BertForSequenceClassification(T.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, num_labels=3, vocab_size=VOCAB, pad_token_id=0, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, **small))
    if name == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=64, sliding_window=8, **small))
    if name == "mixtral":  # mixture of experts: top-2 routing over 4 experts, grouped matmuls by expert
        return T.MixtralForCausalLM(T.MixtralConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2, **small))
    if name == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(
            d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, dropout_rate=0.0, vocab_size=VOCAB,
            pad_token_id=0, eos_token_id=2))
    if name == "bart":
        return T.BartForConditionalGeneration(T.BartConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, **small))
    if name == "vit":
        return T.ViTForImageClassification(T.ViTConfig(
            image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, num_labels=5))
    if name == "electra":  # replaced-token detection: its loss selects the unpadded tokens by a mask
        return T.ElectraForPreTraining(T.ElectraConfig(
            embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, vocab_size=VOCAB,
            pad_token_id=0))
    if name == "wav2vec2":  # convolutional feature encoder, weight-normed positional convolution
        return T.Wav2Vec2ForSequenceClassification(T.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
            layerdrop=0.0, mask_time_prob=0.0, num_labels=3, vocab_size=VOCAB))
    raise ValueError(name)


HF = ("gpt2", "bert", "llama", "mistral", "mixtral", "t5", "bart", "vit", "electra", "wav2vec2")
FAMILIES = tuple(HF) + tuple(VISION)


def _hf_batches(name: str, g: torch.Generator, n: int) -> List[Dict[str, torch.Tensor]]:
    out = []
    for _ in range(n):
        ids = torch.randint(3, VOCAB, (2, 12), generator=g)
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, 8:] = 0  # the second row is padded: padding masks reach attention
        ids[1, 8:] = 0
        if name == "vit":
            out.append(dict(pixel_values=torch.randn(2, 3, 16, 16, generator=g), labels=torch.tensor([1, 4])))
        elif name == "electra":
            out.append(dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (2, 12), generator=g)))
        elif name == "wav2vec2":
            out.append(dict(input_values=torch.randn(2, 400, generator=g), labels=torch.tensor([0, 2])))
        elif name == "bert":
            out.append(dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 3, (2,), generator=g)))
        elif name in ("t5", "bart"):
            labels = torch.randint(3, VOCAB, (2, 7), generator=g)
            labels[1, 5:] = -100
            out.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
        else:
            labels = ids.clone()
            labels[1, 8:] = -100
            out.append(dict(input_ids=ids, attention_mask=mask, labels=labels))
    return out


def make(name: str, seed: int = 0) -> Tuple[nn.Module, List[Dict[str, torch.Tensor]]]:
    """(model, batches): one family with random init and its data."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name in VISION:
        model = VISION[name]()
        batches = [dict(x=torch.randn(4, 3, 32, 32, generator=g), y=torch.randint(0, 10, (4,), generator=g))
                   for _ in range(2)]
        return model, batches
    model = _hf_model(name)
    model.config.use_cache = False
    return model, _hf_batches(name, g, 2)


def loss_of(model: nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    if "x" in batch:
        return F.cross_entropy(model(batch["x"]), batch["y"])
    return model(**batch).loss


def _experts_for_compile(model: nn.Module) -> None:
    """Under torch.compile, Hugging Face's default mixture-of-experts layer
    (grouped_mm) swaps itself for a per-expert loop over the routing read to
    the host unless the weights are bfloat16, which recompiles for every new
    routing (docs/models.md); "batched_mm" keeps the step's shapes fixed."""
    config = getattr(model, "config", None)  # the vision classifiers written here have none
    if getattr(config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("batched_mm")


def train(model: nn.Module, batches, device, steps: int = 3, mode: str = "lazy", autocast: Optional[torch.dtype] = None,
          checkpointing: bool = False, sync: Callable[[], None] = lambda: None) -> List[float]:
    """Trains a copy of `model` with AdamW for `steps` steps on `device`;
    returns the losses. mode: "lazy" (the device traces) or "compile"
    (torch.compile with the pjrt backend, or inductor on the CPU)."""
    model = copy.deepcopy(model).to(device)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [{k: v.to(device) for k, v in b.items()} for b in batches]
    step_fn = lambda b: loss_of(model, b)  # noqa: E731
    if mode == "compile":
        _experts_for_compile(model)
        step_fn = torch.compile(step_fn, backend="pjrt" if torch.device(device).type == "pjrt" else "eager")
    losses = []
    for step in range(steps):
        ctx = torch.autocast(torch.device(device).type, dtype=autocast) if autocast else contextlib.nullcontext()
        with ctx:
            loss = step_fn(data[step % len(data)])
        loss.backward()
        opt.step()
        opt.zero_grad()
        sync()
        losses.append(loss.detach())
    return [float(l.float().cpu()) for l in losses]


def evaluate(model: nn.Module, batches, device, mode: str = "lazy") -> List[float]:
    """Eval-mode losses under torch.inference_mode()."""
    model = copy.deepcopy(model).to(device).eval()
    fn = lambda b: loss_of(model, b)  # noqa: E731
    if mode == "compile":
        _experts_for_compile(model)
        fn = torch.compile(fn, backend="pjrt" if torch.device(device).type == "pjrt" else "eager")
    with torch.inference_mode():
        return [float(fn({k: v.to(device) for k, v in b.items()}).cpu()) for b in batches]
