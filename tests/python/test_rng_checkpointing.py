"""torch's own RNG-state machinery works on pjrt through the device module:
`torch.random.fork_rng(device_type="pjrt")`, and activation checkpointing,
which stashes each device's RNG state before the forward and restores it for
the recomputation, so dropout draws the same masks and gradients match a run
without checkpointing exactly."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torch_pjrt

DEV = torch.device("pjrt", 0)


def test_fork_rng_restores_the_device_stream():
    torch_pjrt.manual_seed(3)
    torch.rand(2, device="pjrt:1").cpu()  # a position past the seed
    with torch.random.fork_rng(devices=[0, 1], device_type="pjrt"):
        inside = [torch.rand(4, device=DEV).cpu(), torch.rand(4, device="pjrt:1").cpu()]
    after = [torch.rand(4, device=DEV).cpu(), torch.rand(4, device="pjrt:1").cpu()]
    assert all(torch.equal(a, b) for a, b in zip(inside, after))


def test_a_new_seed_compiles_nothing_new():
    # The seeded state enters the program as data, not as a constant.
    draws = []
    for i, seed in enumerate((11, 12, 11)):
        torch_pjrt.manual_seed(seed)
        if i == 1:
            torch_pjrt.metrics.reset()
        draws.append(torch.rand(8, device=DEV).cpu())
    assert torch_pjrt.metrics.counters().get("compiles", 0) == 0, torch_pjrt.metrics.report()
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])


def test_device_context_and_state_per_device():
    assert torch.pjrt.current_device() == 0
    with torch.pjrt.device(2):
        assert torch.pjrt.current_device() == 2
        state = torch.pjrt.get_rng_state()  # the current device's
    assert torch.pjrt.current_device() == 0
    assert torch.equal(state, torch.pjrt.get_rng_state("pjrt:2"))
    a = torch.rand(3, device="pjrt:2").cpu()
    torch.pjrt.set_rng_state(state, torch.device("pjrt", 2))
    assert torch.equal(torch.rand(3, device="pjrt:2").cpu(), a)
    assert len(torch.pjrt.get_rng_state_all()) == torch.pjrt.device_count()


def test_seed_and_seed_all_draw_a_new_seed_as_cudas():
    torch.pjrt.manual_seed_all(5)
    torch.pjrt.seed()
    first = torch.pjrt.initial_seed()
    a = torch.rand(4, device=DEV).cpu()
    torch.pjrt.seed_all()
    every = torch.pjrt.initial_seed()
    assert every not in (5, first)
    with torch.pjrt.device(1):  # one seed for every device
        assert torch.pjrt.initial_seed() == every
    torch.pjrt.manual_seed(first)  # the seed says the stream
    assert torch.equal(torch.rand(4, device=DEV).cpu(), a)


def _block(x, w):
    h = torch.nn.functional.dropout(torch.tanh(x @ w), 0.5, training=True)
    return torch.nn.functional.dropout(h @ w, 0.3, training=True)


def _grads(use_checkpoint, reentrant, preserve_rng_state=True):
    torch.manual_seed(11)  # the CPU inputs, and (through the device module) pjrt's stream
    w = torch.randn(8, 8).to(DEV).requires_grad_()
    x = torch.randn(4, 8).to(DEV).requires_grad_()
    if use_checkpoint:
        y = checkpoint(_block, x, w, use_reentrant=reentrant, preserve_rng_state=preserve_rng_state)
    else:
        y = _block(x, w)
    (y * y).sum().backward()
    return [y.detach().cpu(), w.grad.cpu(), x.grad.cpu()]


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_activation_checkpointing_recomputes_the_same_dropout_masks(reentrant):
    plain = _grads(False, reentrant)
    assert all(torch.equal(a, b) for a, b in zip(plain, _grads(True, reentrant)))
    # The check has teeth: recomputing without the stashed state draws new masks.
    stale = _grads(True, reentrant, preserve_rng_state=False)
    assert not torch.equal(stale[1], plain[1])



def _compiled_steps(use_checkpoint, reentrant=False):
    block = (lambda x, w: checkpoint(_block, x, w, use_reentrant=reentrant)) if use_checkpoint else _block
    step = torch.compile(block, backend="pjrt")
    torch.manual_seed(11)
    w = torch.randn(8, 8).to(DEV).requires_grad_()
    x = torch.randn(4, 8).to(DEV).requires_grad_()
    out = []
    for _ in range(3):  # the first call traces, the later ones run what it compiled
        y = step(x, w)
        (y * y).sum().backward()
        out += [y.detach().cpu(), w.grad.cpu(), x.grad.cpu()]
        w.grad = x.grad = None
    return out


def test_compiled_checkpointing_recomputes_the_same_dropout_masks():
    # Under torch.compile AOTAutograd saves the random state around each
    # recomputed random op (run_and_save_rng_state); its masks must be those
    # of the same compiled block without checkpointing, step after step.
    torch_pjrt.metrics.reset()
    plain = _compiled_steps(False)
    assert (plain[0] == 0).any() and not torch.equal(plain[0], plain[3])  # dropped, and new masks each step
    for reentrant in (False, True):
        torch_pjrt.sync(wait=True)
        before = torch_pjrt.metrics.counters()["executions"]
        assert all(torch.equal(a, b) for a, b in zip(plain, _compiled_steps(True, reentrant)))
        # Such graphs are traced on every call (a replay would keep the first
        # call's saved state) but join the step's trace: one program per step.
        assert torch_pjrt.metrics.counters()["executions"] - before == 3
    assert torch_pjrt.metrics.fallbacks() == {}


def test_compiled_checkpointed_steps_that_never_read_are_a_program_each():
    # Graphs traced on every call join the pending trace; called again
    # before it launched, a graph begins a new step (as a replayed one
    # does), so a loop that never reads is a program per step, not one
    # trace of all its steps.
    step = torch.compile(lambda x, w: checkpoint(_block, x, w, use_reentrant=False), backend="pjrt")
    torch.manual_seed(11)
    w = torch.randn(8, 8).to(DEV).requires_grad_()
    x = torch.randn(4, 8).to(DEV)
    step(x, w).sum().backward()
    torch_pjrt.sync(wait=True)
    before = torch_pjrt.metrics.counters()["executions"]
    for _ in range(4):
        step(x, w).sum().backward()
    torch_pjrt.sync(wait=True)
    assert torch_pjrt.metrics.counters()["executions"] - before == 4


def test_the_state_is_known_without_a_sync_and_a_stream_does_not_depend_on_syncs():
    # The host follows the counter (each draw advances it in the program by
    # its own count): get_rng_state launches nothing, and says what a sync
    # would leave; draws in one program equal the same draws with syncs
    # between, and consecutive draws share no bits.
    def draws(sync_between):
        torch_pjrt.manual_seed(5)
        out, states = [], []
        for shape in ((3,), (1000,), (7, 5)):
            out.append(torch.randint(0, 2**62, shape, device=DEV))
            states.append(torch.pjrt.get_rng_state())
            if sync_between:
                torch_pjrt.sync()
        return [o.cpu() for o in out], states

    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    one, one_states = draws(False)
    assert torch_pjrt.metrics.counters()["executions"] == 1  # the read of the draws only
    split, split_states = draws(True)
    assert all(torch.equal(a, b) for a, b in zip(one, split))
    assert all(torch.equal(a, b) for a, b in zip(one_states, split_states))
    values = torch.cat([o.reshape(-1) for o in one])
    assert values.unique().numel() == values.numel()


@pytest.mark.parametrize("generator", [False, True], ids=["default stream", "generator"])
def test_32_bit_draws_of_odd_shapes_do_not_overlap_the_next(generator):
    # XLA's Threefry pads one dim of a 32-bit shape of several odd dims to
    # even (a (3, 5) draw took 9 counters, not the 8 the state moves by), so
    # the next draw repeated its last numbers. Draws are made as vectors:
    # a shaped draw is the vector's numbers, and the next follows it.
    def draws(shapes):
        torch_pjrt.manual_seed(9)
        g = torch.Generator(device=DEV).manual_seed(9) if generator else None
        return [torch.rand(*s, device=DEV, generator=g).cpu() for s in shapes]

    shaped = draws([(3, 5), (3, 5, 7), (5, 3, 9, 11)])
    flat = draws([(15,), (105,), (1485,)])
    assert all(torch.equal(a.reshape(-1), b) for a, b in zip(shaped, flat))
    values = torch.cat([a.reshape(-1) for a in shaped])
    assert values.unique().numel() == values.numel()


def _checkpointed_steps(preserve_rng_state, blocks=3, steps=3):
    torch.manual_seed(11)
    ws = [torch.randn(8, 8).to(DEV).requires_grad_() for _ in range(blocks)]
    x = torch.randn(4, 8).to(DEV)
    out = []
    for _ in range(steps):
        h = x
        for w in ws:
            h = checkpoint(_block, h, w, use_reentrant=False, preserve_rng_state=preserve_rng_state)
        (h * h).sum().backward()
        out.append([w.grad for w in ws])
        for w in ws:
            w.grad = None
        torch_pjrt.sync()
    return out


def test_a_step_of_checkpointed_blocks_with_dropout_is_one_program():
    # Each checkpointed block reads the random state (get_rng_state) to
    # replay it in the backward: that launches nothing, so the step is one
    # program, and the masks are those of the forward (the gradients those
    # of the same blocks without checkpointing).
    _checkpointed_steps(True, steps=2)
    torch_pjrt.sync(wait=True)
    torch_pjrt.metrics.reset()
    got = _checkpointed_steps(True)
    c = torch_pjrt.metrics.counters()
    assert c["executions"] == 3 and c.get("compiles", 0) == 0, torch_pjrt.metrics.report()
    got = [[g.cpu() for g in grads] for grads in got]

    def plain():
        torch.manual_seed(11)
        ws = [torch.randn(8, 8).to(DEV).requires_grad_() for _ in range(3)]
        x = torch.randn(4, 8).to(DEV)
        out = []
        for _ in range(3):
            h = x
            for w in ws:
                h = _block(h, w)
            (h * h).sum().backward()
            out.append([w.grad.cpu() for w in ws])
            for w in ws:
                w.grad = None
        return out

    for a, b in zip(got, plain()):
        for ga, gb in zip(a, b):
            torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-6)
    stale = [[g.cpu() for g in grads] for grads in _checkpointed_steps(False)]
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(got, stale))
