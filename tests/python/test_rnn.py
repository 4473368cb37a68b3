"""Recurrent networks on pjrt against eager CPU: nn.RNN (tanh, relu),
nn.LSTM (with proj_size), nn.GRU and the cell modules, multi-layer,
bidirectional, batch_first, with initial states and packed sequences;
forward outputs, final states and the gradients of inputs, states and
weights must match, and nothing may fall back to the CPU. ATen sends pjrt
tensors to the fused LSTM/GRU cell kernels, lowered in csrc/aten/ops_rnn.cc.

Tolerance: float32 sigmoid/tanh and the gate sums differ from the CPU by a
few ulps per step (the fused cell adds the four gate terms in another order
than the CPU's two linears); 1e-5 relative plus 1e-6 absolute holds with a
wide margin on these short sequences, and any wrong gate, order or bias
moves results by >1e-2."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torch_pjrt

DEV = torch_pjrt.device()
RTOL, ATOL = 1e-5, 1e-6


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def to_dev(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(DEV).requires_grad_(x.requires_grad)
    if isinstance(x, (tuple, list)):
        return type(x)(to_dev(e) for e in x)
    return x


def leaves(x):
    """The tensors of a nested result (PackedSequence gives its data)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if hasattr(x, "batch_sizes"):
        return [x.data]
    return [t for e in x for t in leaves(e)]


def run(module, inputs):
    """Forward, then backward of a weighted sum of every output; returns the
    outputs, the input gradients and the parameter gradients."""
    outs = leaves(module(*inputs))
    loss = sum((o * randn(*o.shape, seed=i).to(o.device)).sum() for i, o in enumerate(outs))
    loss.backward()
    grads_in = [t.grad for t in leaves(inputs) if t.requires_grad]
    grads_w = [p.grad for p in module.parameters()]
    return outs, grads_in, grads_w


def check_parity(make, inputs):
    torch.manual_seed(0)
    cpu = make()
    dev = copy.deepcopy(cpu).to(DEV)
    dev_inputs = to_dev(inputs)
    torch_pjrt.metrics.reset()
    got = run(dev, dev_inputs)
    torch_pjrt.sync()
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
    want = run(cpu, inputs)
    for kind, g, w in zip(("output", "input grad", "weight grad"), got, want):
        assert len(g) == len(w)
        for k, (a, b) in enumerate(zip(g, w)):
            assert a is not None and b is not None, f"{kind} {k} missing"
            torch.testing.assert_close(a.cpu(), b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{kind} {k}: {m}")


# Short sequences: compile time grows with the unrolled steps, and two steps
# already carry a state from one step to the next (forward and backward).
T, B, I, H = 2, 2, 3, 4


def seq(batch_first=False, seed=1):
    shape = (B, T, I) if batch_first else (T, B, I)
    return randn(*shape, seed=seed).requires_grad_()


def state(layers, directions=1, size=H, seed=2):
    return randn(layers * directions, B, size, seed=seed).requires_grad_()


def cell_state(seed=2):
    return randn(B, H, seed=seed).requires_grad_()


# name -> (module factory, inputs factory); each case covers several options
# to keep the number of compiled programs (the test's time) small.
MODULES = {
    "rnn_tanh_2layer_bidir_batch_first_h0": (
        lambda: nn.RNN(I, H, 2, bidirectional=True, batch_first=True),
        lambda: (seq(True), state(2, 2))),
    "rnn_relu_no_bias": (lambda: nn.RNN(I, H, nonlinearity="relu", bias=False), lambda: (seq(), state(1))),
    "lstm_2layer_bidir_batch_first_h0c0": (
        lambda: nn.LSTM(I, H, 2, bidirectional=True, batch_first=True),
        lambda: (seq(True), (state(2, 2), state(2, 2, seed=3)))),
    # dropout=0 in train mode takes the dropout path without randomness
    "lstm_2layer_no_bias_no_state_train_dropout0": (lambda: nn.LSTM(I, H, 2, bias=False, dropout=0.0).train(),
                                                    lambda: (seq(),)),
    "lstm_proj_h0c0": (lambda: nn.LSTM(I, H, proj_size=2), lambda: (seq(), (state(1, size=2), state(1, seed=3)))),
    "gru_2layer_bidir_batch_first_h0": (
        lambda: nn.GRU(I, H, 2, bidirectional=True, batch_first=True),
        lambda: (seq(True), state(2, 2))),
    "gru_no_bias_no_state": (lambda: nn.GRU(I, H, bias=False), lambda: (seq(),)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_cpu(name):
    make, inputs = MODULES[name]
    check_parity(make, inputs())


class Packed(nn.Module):
    """pack_padded_sequence -> rnn -> pad_packed_sequence, unsorted lengths."""

    def __init__(self, rnn, batch_first):
        super().__init__()
        self.rnn, self.batch_first = rnn, batch_first

    def forward(self, x, h):
        # CPU lengths, as PyTorch requires; unsorted, so the batch is permuted
        # (and the states with it) and put back
        lengths = torch.tensor([1, T])
        p = pack_padded_sequence(x, lengths, batch_first=self.batch_first, enforce_sorted=False)
        out, hn = self.rnn(p, h)
        out, out_lengths = pad_packed_sequence(out, batch_first=self.batch_first, total_length=T)
        assert out_lengths.tolist() == lengths.tolist()
        return out, hn


PACKED = {
    "lstm_bidir_batch_first": (lambda: nn.LSTM(I, H, bidirectional=True, batch_first=True), True,
                               lambda: (state(1, 2), state(1, 2, seed=3))),
    "gru_2layer": (lambda: nn.GRU(I, H, 2), False, lambda: state(2)),
}


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_sequence_matches_cpu(name):
    make, batch_first, h = PACKED[name]
    check_parity(lambda: Packed(make(), batch_first), (seq(batch_first), h()))


class Cells(nn.Module):
    """Every cell module; LSTMCell and GRUCell two steps with the state fed
    back and once without a state."""

    def __init__(self):
        super().__init__()
        self.rnn_tanh = nn.RNNCell(I, H)
        self.rnn_relu = nn.RNNCell(I, H, bias=False, nonlinearity="relu")
        self.lstm = nn.LSTMCell(I, H)
        self.lstm_no_bias = nn.LSTMCell(I, H, bias=False)
        self.gru = nn.GRUCell(I, H)
        self.gru_no_bias = nn.GRUCell(I, H, bias=False)

    def forward(self, x, h, c):
        outs = [self.lstm(x[0]), self.gru(x[0])]
        for cell in (self.rnn_tanh, self.rnn_relu, self.lstm, self.lstm_no_bias, self.gru, self.gru_no_bias):
            state_ = (h, c) if isinstance(cell, nn.LSTMCell) else h
            for t in range(2 if cell in (self.lstm, self.gru) else 1):
                state_ = cell(x[t], state_)
                outs.append(state_)
        return outs


def test_cells_match_cpu():
    check_parity(Cells, (seq(), cell_state(), cell_state(seed=3)))


def test_dropout_between_layers_uses_device_rng():
    """A 2-layer relu RNN made to pass its input through (identity input
    weights, zero recurrence, zero biases) shows the dropout mask between its
    layers: out = x * mask / (1 - p)."""
    p, n = 0.25, 4
    rnn = nn.RNN(n, n, 2, nonlinearity="relu", dropout=p)
    with torch.no_grad():
        for name, w in rnn.named_parameters():
            w.copy_(torch.eye(n) if name.startswith("weight_ih") else torch.zeros_like(w))
    rnn = rnn.to(DEV)
    x = torch.rand(2, 1000, n) + 0.5
    torch_pjrt.metrics.reset()
    out1, _ = rnn(x.to(DEV))
    out2, _ = rnn(x.to(DEV))
    torch_pjrt.sync()
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
    out1, out2 = out1.cpu(), out2.cpu()
    kept = out1 != 0
    # 8000 Bernoulli(0.75) draws: the ratio's standard deviation is 0.005
    assert abs(kept.float().mean().item() - (1 - p)) < 0.03
    torch.testing.assert_close(out1[kept], (x / (1 - p))[kept])
    assert not torch.equal(kept, out2 != 0), "each call must draw a new mask"
    rnn.eval()
    torch.testing.assert_close(rnn(x.to(DEV))[0].cpu(), x)


def test_sequence_traces_into_one_program():
    """Forward and backward of a 6-step LSTM: one program, compiled once."""
    lstm = nn.LSTM(I, H).to(DEV)
    x = randn(6, B, I, seed=1).to(DEV).requires_grad_()
    torch_pjrt.sync()
    torch_pjrt.metrics.reset()
    out, (h, c) = lstm(x)
    (out.sum() + c.sum()).backward()
    torch_pjrt.sync()
    counters = torch_pjrt.metrics.counters()
    assert counters.get("compiles", 0) + counters.get("cache_hits", 0) == 1, counters
    assert counters.get("executions", 0) == 1, counters
    assert torch_pjrt.metrics.fallbacks() == {}


class CharLM(nn.Module):
    def __init__(self, vocab=24, emb=12, hidden=24):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out)


def train_char_lm(device, steps=5):
    torch.manual_seed(0)
    model = CharLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    text = torch.randint(0, 24, (4, 7), generator=torch.Generator().manual_seed(5))
    x, y = text[:, :-1].to(device), text[:, 1:].to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if device != "cpu":
            torch_pjrt.sync()  # one program per step, as a training loop would
    return [float(v) for v in losses], {k: v.cpu() for k, v in model.state_dict().items()}


def test_char_lstm_language_model_trains_like_cpu():
    cpu_losses, cpu_state = train_char_lm("cpu")
    torch_pjrt.metrics.reset()
    losses, state_ = train_char_lm(DEV)
    assert torch_pjrt.metrics.fallbacks() == {}, torch_pjrt.metrics.report()
    assert cpu_losses[-1] < cpu_losses[0] - 0.1, "the model should learn"
    assert losses == pytest.approx(cpu_losses, rel=2e-3)
    for k in cpu_state:
        torch.testing.assert_close(state_[k], cpu_state[k], rtol=2e-3, atol=1e-5, msg=lambda m: f"{k}: {m}")


def test_gru_cell_compiles_with_dynamic_shapes():
    """nn.GRUCell under torch.compile(dynamic=True): the fused cell and its
    backward have meta kernels (torch_pjrt.dynamo), so fake tensors of
    symbolic batch size run them (fullgraph=True raised "does not support
    running with fake tensors"; without it, a silent graph break)."""
    torch.manual_seed(0)
    cell = nn.GRUCell(4, 8)
    dev = copy.deepcopy(cell).to(DEV)
    f = torch.compile(lambda x, h: dev(x, h), backend="pjrt", dynamic=True, fullgraph=True)
    for batch in (3, 5):
        x, h = torch.randn(batch, 4, requires_grad=True), torch.randn(batch, 8)
        cell(x, h).square().sum().backward()
        xd = x.detach().to(DEV).requires_grad_()
        f(xd, h.to(DEV)).square().sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), x.grad)
        torch.testing.assert_close(dev.bias_hh.grad.cpu(), cell.bias_hh.grad)
        cell.zero_grad()
        dev.zero_grad()
