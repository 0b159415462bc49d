"""Fused AdamW (C++ CPU kernel and Triton under the interpreter) against the fp64 reference, which is
itself checked against ``torch.optim.AdamW``. Sizes stay <= 64K elements for the interpreter."""

import pytest
import torch

import kernels
from kernels import reference
from tests.kernels.impls import IMPLS, adamw, make, nonfinite

HP = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
N = 40_000
RANGES = [(0, 12_000), (12_016, 30_000), (31_000, 39_990)]


def _mask(n, ranges):
    m = torch.zeros(n, dtype=torch.bool)
    for lo, hi in ranges:
        m[lo:hi] = True
    return m


def test_reference_is_torch_adamw_in_fp64():
    p = make(1000, torch.float64, 1)
    ref = p.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=HP["lr"], betas=HP["betas"], eps=HP["eps"], weight_decay=HP["weight_decay"])
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for step in range(1, 6):
        g = make(1000, torch.float64, 10 + step)
        ref.grad = g.clone()
        opt.step()
        p, m, v = reference.adamw(
            p,
            g * 4,
            m,
            v,
            torch.ones(1000, dtype=torch.bool),
            lr=HP["lr"],
            beta1=HP["betas"][0],
            beta2=HP["betas"][1],
            eps=HP["eps"],
            weight_decay=HP["weight_decay"],
            step=step,
            grad_scale=0.25,
        )
    torch.testing.assert_close(p, ref.detach(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_table_over_spans_updates_only_them(impl):
    """One param group's launch (``adamw_blocks(..., spans)``): inside the spans exactly the full launch's
    values, outside them p, m, v and the parameter copy untouched."""
    spans = [(100, 5_000), (12_000, 12_016), (20_000, 33_333)]
    inside = _mask(N, spans)
    full = [make(N, seed=1), torch.zeros(N), torch.zeros(N), torch.zeros(N, dtype=torch.bfloat16)]
    part = [t.clone() for t in full]
    g = make(N, torch.float32, seed=5, scale=3.0)
    for spans_arg, (p, m, v, out) in ((None, full), (spans, part)):
        adamw(impl, p, g, m, v, RANGES, out=out, step=1, grad_scale=0.5, spans=spans_arg, **HP)
    start = make(N, seed=1)
    for f, q, before in zip(full, part, (start, torch.zeros(N), torch.zeros(N), torch.zeros(N, dtype=torch.bfloat16))):
        assert torch.equal(q[inside], f[inside])
        assert torch.equal(q[~inside], before[~inside])
    assert not torch.equal(full[0][~inside], start[~inside])  # the full launch did move the rest


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
def test_fused_adamw_matches_fp64_reference(impl, grad_dtype, out_dtype):
    p = make(N, seed=1)
    m, v = torch.zeros(N), torch.zeros(N)
    p64, m64, v64 = p.double(), m.double(), v.double()
    mask = _mask(N, RANGES)
    for step in range(1, 4):
        g = make(N, grad_dtype, seed=20 + step, scale=3.0)
        out = torch.empty(N, dtype=out_dtype) if out_dtype else None
        adamw(impl, p, g, m, v, RANGES, out=out, step=step, grad_scale=0.5, **HP)
        p64, m64, v64 = reference.adamw(
            p64,
            g.double(),
            m64,
            v64,
            mask,
            beta1=HP["betas"][0],
            beta2=HP["betas"][1],
            lr=HP["lr"],
            eps=HP["eps"],
            weight_decay=HP["weight_decay"],
            step=step,
            grad_scale=0.5,
        )
        torch.testing.assert_close(p.double(), p64, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(m.double(), m64, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(v.double(), v64, rtol=1e-6, atol=1e-7)
        if out is not None:  # bit-equal to round-to-nearest-even of the updated fp32 partition
            assert torch.equal(out.view(torch.int16), p.to(out_dtype).view(torch.int16))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_adopt_steps_from_the_elements_changed_in_the_copy(impl, out_dtype):
    """``adopt=True``: where the parameter copy no longer holds the master's rounding (changed in place since the
    last step wrote it), the step starts from the copy's value; everywhere else from the master, bit for bit as
    without ``adopt``. Outside the launch's spans nothing is taken. Without ``adopt`` the copy is only written."""
    spans = [(0, 20_000), (25_000, N)]
    p0 = make(N, seed=1)
    out0 = p0.to(out_dtype)  # what the last step wrote
    edited = torch.zeros(N, dtype=torch.bool)
    edited[[5, 6, 7, 19_999, 22_000, 25_000, 39_999]] = True
    out0[[5, 19_999, 22_000, 25_000]] = 0.0  # zeroed (22_000 is outside the spans)
    out0[6] = -out0[6]
    out0[7] = 0.125
    out0[39_999] = out0[39_999] * 2
    g = make(N, seed=5, scale=3.0)
    runs = {}
    for flag in (True, False):
        p, m, v, out = p0.clone(), torch.zeros(N), torch.zeros(N), out0.clone()
        adamw(impl, p, g, m, v, RANGES, out=out, step=1, grad_scale=0.5, spans=spans, adopt=flag, **HP)
        runs[flag] = (p, out)
    inside = _mask(N, spans)
    start = torch.where(edited & inside, out0.float(), p0)
    p, m, v, out = start.clone(), torch.zeros(N), torch.zeros(N), out0.clone()
    adamw(impl, p, g, m, v, RANGES, out=out, step=1, grad_scale=0.5, spans=spans, **HP)
    assert torch.equal(runs[True][0], p) and torch.equal(runs[True][1].view(torch.int16), out.view(torch.int16))
    assert runs[True][0][22_000] == p0[22_000]  # outside the spans: neither stepped nor taken
    assert not torch.equal(runs[False][0][edited & inside], p[edited & inside])  # the copy was ignored
    unchanged = inside & ~edited
    assert torch.equal(runs[True][0][unchanged], runs[False][0][unchanged])


@pytest.mark.parametrize("impl", IMPLS)
def test_copy_out_rounds_to_nearest_even_on_ties_and_specials(impl):
    # fp32 values exactly halfway between two bf16 values, plus inf/nan/tiny: lr=0 leaves p unchanged.
    base = torch.tensor([1.0, 1.0078125, -3.0, 65504.0, 1e-40, 3.0e38], dtype=torch.float32)
    bits = base.view(torch.int32)
    halfway = (bits | 0x8000).view(torch.float32)  # ...x.1000 0000 0000 0000: a tie
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    p = torch.cat([base, halfway, halfway.nextafter(torch.tensor(float("inf"))), special])
    n = p.numel()
    for dt in (torch.bfloat16, torch.float16):
        q = p.clone()
        out = torch.empty(n, dtype=dt)
        adamw(
            impl,
            q,
            torch.zeros(n),
            torch.zeros(n),
            torch.zeros(n),
            [],
            out=out,
            lr=0.0,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.0,
            step=1,
            grad_scale=1.0,
        )
        expect = p.to(dt)
        nan = torch.isnan(expect)
        assert torch.equal(torch.isnan(out), nan)
        assert torch.equal(out[~nan].view(torch.int16), expect[~nan].view(torch.int16))


@pytest.mark.parametrize("impl", IMPLS)
def test_found_inf_flag_skips_the_step(impl):
    p, m, v = make(3000, seed=3), torch.ones(3000), torch.ones(3000)
    before = [t.clone() for t in (p, m, v)]
    out = torch.zeros(3000, dtype=torch.bfloat16)
    adamw(impl, p, make(3000, seed=4), m, v, [(0, 100)], out=out, found_inf=torch.ones(1), step=1, grad_scale=1.0, **HP)
    for a, b in zip((p, m, v), before):
        assert torch.equal(a, b)
    assert not out.any()
    adamw(
        impl, p, make(3000, seed=4), m, v, [(0, 100)], out=out, found_inf=torch.zeros(1), step=1, grad_scale=1.0, **HP
    )
    assert not torch.equal(p, before[0]) and torch.equal(out, p.to(torch.bfloat16))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_nonfinite_flag(impl, dtype, bad):
    x = make(5000, dtype, seed=5)
    if bad is not None:
        x[4321] = bad
    flag = torch.zeros(1)
    nonfinite(impl, x, flag)
    assert flag.item() == (0.0 if bad is None else 1.0)
    nonfinite(impl, make(10, dtype), flag)  # a clean tensor never clears a raised flag
    assert flag.item() == (0.0 if bad is None else 1.0)


def test_the_any_device_body_updates_only_the_tables_rows():
    """The op's default body (devices with no kernel) used the table only for weight decay and stepped, and adopted,
    every element: a param group's launch over spans moved the other groups' elements once per group. It now
    matches the C++ kernel inside the spans and leaves everything else as it was."""
    from kernels.ops import _adamw_cpu, adamw_any_device

    spans = [(100, 5_000), (20_000, 20_016)]
    blocks = kernels.adamw_blocks(N, RANGES, "cpu", spans)
    inside = _mask(N, spans)
    runs = []
    for body in (adamw_any_device, _adamw_cpu):
        p, m, v = make(N, seed=1), torch.zeros(N), torch.zeros(N)
        out = p.to(torch.bfloat16)
        out[::7] = 0.5  # edits the adopt flag takes in, inside and outside the spans
        g = make(N, torch.float32, seed=5, scale=3.0)
        body(p, g, m, v, out, blocks, None, HP["lr"], *HP["betas"], HP["eps"], HP["weight_decay"], 1, 0.5, adopt=True)
        runs.append((p, m, v, out))
    start = make(N, seed=1)
    for got, cpu in zip(*runs):
        torch.testing.assert_close(got[inside], cpu[inside], rtol=1e-6, atol=1e-7)
    assert torch.equal(runs[0][0][~inside], start[~inside]) and not runs[0][1][~inside].any()


def test_a_table_the_kernel_cannot_run_is_refused():
    """A table from another partition or device: the C++ kernel wrote past the partition (heap corruption), and the
    Triton kernel steps at most its block of a row, leaving the rest unstepped with no error."""
    p, g = torch.zeros(100), torch.zeros(100)
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, step=1)
    with pytest.raises(ValueError, match=r"blocks row \(0, 200\) is not a range of at most 16384"):
        kernels.fused_adamw_(p, g, g.clone(), g.clone(), blocks=kernels.adamw_blocks(200, [], "cpu"), **kw)
    long = torch.tensor([[0, 100, 0]])
    from kernels import tables

    too_long = tables.adamw_blocks(40_000, [], 20_000)
    with pytest.raises(ValueError, match=r"blocks row \(0, 20000\) is not a range of at most 16384"):
        big = torch.zeros(40_000)
        kernels.fused_adamw_(big, big.clone(), big.clone(), big.clone(), blocks=too_long, **kw)
    with pytest.raises(ValueError, match="blocks must be an \\[n, 3\\] int64 table"):
        kernels.fused_adamw_(p, g, g.clone(), g.clone(), blocks=long.int(), **kw)
    kernels.fused_adamw_(p, g, g.clone(), g.clone(), blocks=long, **kw)  # a valid hand-made table runs


def test_bad_arguments_get_one_line_errors():
    p, g = torch.zeros(10), torch.zeros(10)
    blocks = kernels.adamw_blocks(10, [], "cpu")
    kw = dict(blocks=blocks, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, step=1)
    with pytest.raises(ValueError, match="must be fp32"):
        kernels.fused_adamw_(p.half(), g, g.clone(), g.clone(), **kw)
    with pytest.raises(ValueError, match="grad must be a contiguous tensor of 10"):
        kernels.fused_adamw_(p, torch.zeros(9), g.clone(), g.clone(), **kw)
    with pytest.raises(ValueError, match="1-based"):
        kernels.fused_adamw_(p, g, g.clone(), g.clone(), **{**kw, "step": 0})
    with pytest.raises(Exception, match="unknown kernel mode 'fast'"):
        kernels.resolve("fast", "cpu")


def test_cpu_kernel_within_one_ulp_of_torch_adamw():
    """Same formula, same scalar derivation and the same fused multiply-add as torch's addcdiv; what is
    left is torch's vectorized sqrt, which is not always correctly rounded (ours is). An ulp of sqrt moves
    the update m/denom by an ulp or two more through the division, so parameters may differ by a few ulps
    of max(|p|, |update| ~ lr): held to 4 (measured 3.4), with most elements bit-equal."""
    p = make(50_000, seed=11) * 0.02
    ref = p.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    blocks = kernels.adamw_blocks(p.numel(), [(0, p.numel())], "cpu")
    for step in range(1, 4):
        g = make(50_000, seed=30 + step) * 1e-3
        ref.grad = g.clone()
        opt.step()
        kernels.fused_adamw_(
            p, g, m, v, blocks=blocks, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=step
        )
        ulp = torch.maximum(ref.detach().abs(), torch.full_like(p, 1e-3)) * 2.0**-23
        assert ((p - ref.detach()).abs() <= 4 * ulp).all()
        assert (p != ref.detach()).float().mean() < 0.5  # most elements bit-equal
        assert torch.equal(m, opt.state[ref]["exp_avg"])


def test_eager_call_and_the_dispatched_op_agree_bit_for_bit():
    """``kernels.fused_adamw_`` calls the device body directly in eager mode; through the dispatcher
    (``torch.ops.zerobench.adamw_``, and inside ``torch.compile``) the same body runs."""
    if not kernels.available("cpu")[0]:
        pytest.skip("the C++ CPU kernels are not built here")
    blocks = kernels.adamw_blocks(N, RANGES, "cpu")
    hp = dict(lr=HP["lr"], betas=HP["betas"], eps=HP["eps"], weight_decay=HP["weight_decay"], step=3, grad_scale=0.5)
    g = make(N, torch.float32, 2)
    runs = []
    for how in ("eager", "op", "compiled"):
        p, m, v = make(N, torch.float32, 1), make(N, torch.float32, 3).abs(), make(N, torch.float32, 4).abs()
        out = torch.empty(N, dtype=torch.bfloat16)
        if how == "eager":
            kernels.fused_adamw_(p, g, m, v, blocks=blocks, out=out, **hp)
        elif how == "op":
            torch.ops.zerobench.adamw_(
                p,
                g,
                m,
                v,
                out,
                blocks,
                None,
                hp["lr"],
                *hp["betas"],
                hp["eps"],
                hp["weight_decay"],
                hp["step"],
                hp["grad_scale"],
            )
        else:

            def step(p, g, m, v, out):
                kernels.fused_adamw_(p, g, m, v, blocks=blocks, out=out, **hp)

            torch.compile(step, backend="aot_eager", fullgraph=True)(p, g, m, v, out)
        runs.append((p, m, v, out))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
