#!/usr/bin/env python3
"""The plain-PyTorch floor for dsv4's FP8 / FP4 GEMMs, measured on the GPU in one run.

What a user without dsv4 could write in a few lines of PyTorch for the same operations, timed the
same way as bench/bench_gpu_gemm: the number our kernels have to beat by a clear margin to be worth
having. Nothing here calls dsv4; it needs only torch with CUDA.

Two times for every case:
- eager: CUDA events around each run, the median of --runs runs (50; 10 with --quick) after a
  warm-up. Plain eager PyTorch, so the host's launch gaps count wherever the host is slower than
  the GPU, as a user would see them (the "eager launch" ceiling line gives the host's cost of one
  op; at decode sizes it is most of the eager time).
- graph: the same calls captured in a CUDA graph and replayed, as bench_gpu_gemm and the engine's
  decode graphs run: the GPU's own time for the plain code, the fairer floor for our kernels.
  Dense: per call, the median of 5 replays of a graph of >= --runs calls (every weight copy at
  least once); MoE: 5 runs (3 with --quick), each with fresh routing whose per-expert counts are
  read beforehand, captured, replayed once, L2 flushed, replayed between events; the median.

Measured:

1. Dense FP8 block-scaled linear at V4-Flash and V4-Pro layer shapes (wq_a, wq_b, wkv, wo_b,
   shared-expert w1), rows M = 1, 8, 64, 128, 4096. Weight float8_e4m3fn [N][K], fp32 scale per
   128 x 128 block [ceil(N/128)][ceil(K/128)], activation bf16 [M][K]. Paths:
   - dequant+bf16: w_bf16 = (w.float() * block scales).bfloat16(); y = x @ w_bf16.T. The time
     includes the dequantization: a user who stores fp8 dequantizes on every call.
   - bf16 stored: y = x @ w_bf16.T with the weight kept in bf16 (twice the memory): cuBLAS's bf16
     GEMM alone, what the dequantization costs on top of it (detail table only).
   - _scaled_mm tensor: torch._scaled_mm with per-tensor scales (not the model's numerics; a
     reference for PyTorch's fp8 kernel). GEMM only: x is quantized once outside the timing, as
     bench_gpu_gemm times gemm_quantized on activations quantized beforehand.
   - _scaled_mm block: PyTorch's DeepSeek-style recipe (x 1x128, w 128x128 fp32 scales; SM90 with
     a recent torch/cuBLAS), GEMM only; rows padded to a multiple of 4. n/a where unsupported.
   Both _scaled_mm paths are checked against the dequantized product first; one that does not
   match is reported "wrong" and not timed.
2. MoE with FP4 experts (e2m1 packed two per byte, low nibble = even k; one UE8M0 scale byte per
   32 values, value = e2m1 * 2^(byte-127)): V4-Flash (256 experts, hidden 4096, inter 2048) and
   V4-Pro (384, 7168, 3072), top-6, tokens 1, 16, 64, 256, 4096. Per run: route (fresh random
   logits each run, top-6 of sqrt(softplus(logits)) + bias, weights normalised), sort the
   (token, expert) pairs by expert (one host sync for the counts), then for every expert hit
   dequantize its w1, w3, w2 to bf16 through a 256-entry byte -> two-values table times the
   scales, h = silu(x w1^T) * (x w3^T), y += weight * (h w2^T). GB/s counts the touched experts'
   fp4 bytes + scale bytes (experts hit: the mean over the runs).

Weights are rotated through copies that together exceed the 50 MB L2 many times over (>= 256 MiB
per dense shape, each timed run reading a different copy; MoE: 2 copies of all experts, fresh
routing every run), so every run reads its weights from HBM, as a model's layers do.

Ceilings measured in the same run: HBM bandwidth of a large device-to-device copy (bytes = 2 x
size), bf16 peak of an 8192^3 matmul, fp8 _scaled_mm 8192^3 where it works, and the host's cost of
one eager op.

Before timing, a self-check compares the plain dequantizations (fp8 blocks, fp4 nibbles and
scales, the whole MoE forward) with slow per-element references on small shapes; a failure makes
the exit status 1.

Output: detail tables (op and shape, path, M/tokens, us, GB/s on the stored weight bytes touched,
TFLOP/s, the same three for the graph), then a compact summary whose lines start with "| torch"
(tools/gpu-check.sh greps them): dequant+bf16 and the checked _scaled_mm path per dense shape,
the MoE rows, the ceilings; each cell "eager / graph".

  python3 bench/torch_floor.py [--quick] [--shapes flash,pro] [--rows 1,8,64,128,4096]
                               [--tokens 1,16,64,256,4096] [--runs N] [--parts dense,moe]
  python3 bench/torch_floor.py --cpu-smoke     checks the dequantization and MoE math on the CPU
                                               (tiny shapes, any torch >= 1.13), no timing worth
                                               reading
Exit status: 0 done, 1 a self-check or a plain path failed, 2 no CUDA device.
"""

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

FP8 = getattr(torch, "float8_e4m3fn", None)
OOM = getattr(torch.cuda, "OutOfMemoryError", None)
if OOM is None:  # torch < 1.13

    class OOM(Exception):  # noqa: N801 (never raised)
        pass


MiB = 1 << 20
GiB = 1 << 30
ROTATE_BYTES = 256 * MiB  # weight copies per dense shape, > 5x the H200's 50 MB L2 (--cpu-smoke: 1 MiB)

# name -> (dense shapes [(op, N, K)], MoE (experts, top-k, hidden, inter, routed scale))
MODELS = {
    # V4-Flash: hidden 4096, q_lora 1024, 64 heads x 512, o_groups 8 x o_lora 1024, moe inter 2048
    "flash": (
        [("wq_a", 1024, 4096), ("wq_b", 32768, 1024), ("wkv", 512, 4096), ("wo_b", 4096, 8192),
         ("shared w1", 2048, 4096)],
        (256, 6, 4096, 2048, 1.5),
    ),
    # V4-Pro: hidden 7168, q_lora 1536, 128 heads x 512, o_groups 16 x o_lora 1024, moe inter 3072
    "pro": (
        [("wq_a", 1536, 7168), ("wq_b", 65536, 1536), ("wkv", 512, 7168), ("wo_b", 7168, 16384),
         ("shared w1", 3072, 7168)],
        (384, 6, 7168, 3072, 2.5),
    ),
    # --cpu-smoke only
    "tiny": (
        [("wq_a", 256, 384), ("odd", 200, 300)],
        (8, 2, 128, 64, 1.5),
    ),
}

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ---------------------------------------------------------------------------------------------
# The plain-PyTorch operations (what is timed)


def dequant_fp8(w, s):
    """w [N][K] fp8 (any float dtype in --cpu-smoke), s [ceil(N/128)][ceil(K/128)] fp32 -> bf16."""
    n, k = w.shape
    nb, kb = s.shape
    if n % 128 == 0 and k % 128 == 0:
        return (w.float().view(nb, 128, kb, 128) * s[:, None, :, None]).view(n, k).bfloat16()
    se = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (w.float() * se).bfloat16()


def linear_dequant(x, w, s):
    return x @ dequant_fp8(w, s).t()


def fp4_tables(device):
    """Two lookup tables: byte b -> the bf16 pair (e2m1(b & 15), e2m1(b >> 4)) held as one int32
    (the even element in the low nibble), and UE8M0 byte e -> bf16 2^(e-127). One gather per
    table: every eager op costs a launch, which is most of the time at decode sizes."""
    lut = torch.tensor(E2M1, dtype=torch.float32)
    b = torch.arange(256)
    pair = torch.stack([lut[b & 15], lut[b >> 4]], dim=1).to(torch.bfloat16).contiguous()
    scale = torch.exp2(b.float() - 127.0).to(torch.bfloat16)
    return pair.view(torch.int32).view(256).to(device), scale.to(device)


def dequant_fp4(packed, sbytes, tables):
    """packed [N][K/2] uint8, sbytes [N][K/32] uint8 (UE8M0) -> bf16 [N][K] (exact: e2m1 x 2^e)."""
    pair, scale = tables
    n, half = packed.shape
    k = half * 2
    v = pair[packed.long()].view(torch.bfloat16).view(n, k // 32, 32)
    return (v * scale[sbytes.long()].unsqueeze(-1)).view(n, k)


def route(logits, bias, topk, routed_scale):
    s = torch.sqrt(F.softplus(logits.float()))
    ids = torch.topk(s + bias, topk, dim=-1).indices
    w = s.gather(1, ids)
    return ids, w / w.sum(dim=-1, keepdim=True) * routed_scale


def route_sorted(logits, bias, topk, routed_scale):
    """-> (expert of each (token, slot) pair, flat; the pairs' tokens and weights sorted by expert)."""
    ids, wts = route(logits, bias, topk, routed_scale)
    flat = ids.flatten()
    order = flat.argsort()
    return flat, torch.div(order, topk, rounding_mode="floor"), wts.flatten()[order]


def moe_plain(x, logits, bias, topk, routed_scale, experts, tables, stats=None, counts=None):
    """x [T][D] bf16; experts = (w1, s1, w3, s3, w2, s2), each indexed [expert]. -> y [T][D] bf16.
    counts (pairs per expert) given: no host sync, so the call can be captured in a CUDA graph."""
    w1, s1, w3, s3, w2, s2 = experts
    t = x.shape[0]
    n_exp = w1.shape[0]
    flat, tok, wsorted = route_sorted(logits, bias, topk, routed_scale)
    if counts is None:
        counts = torch.bincount(flat, minlength=n_exp).tolist()  # the one host sync
    xs = x[tok]
    y = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
    off = 0
    hit = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        hit += 1
        sl = slice(off, off + c)
        off += c
        a = dequant_fp4(w1[e], s1[e], tables)
        b = dequant_fp4(w3[e], s3[e], tables)
        d = dequant_fp4(w2[e], s2[e], tables)
        xe = xs[sl]
        h = F.silu(xe @ a.t()) * (xe @ b.t())
        y.index_add_(0, tok[sl], (h @ d.t()).float() * wsorted[sl, None])
    if stats is not None:
        stats.append(hit)
    return y.bfloat16()


# ---------------------------------------------------------------------------------------------
# torch._scaled_mm (PyTorch's own fp8 kernels; optional)


def quantize_tensor(x):
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = amax / 448.0
    return (x.float() / scale).to(FP8), scale.reshape(())


def quantize_1x128(x):
    """x [M][K] -> fp8 [M][K], fp32 scales [M][K/128] (K a multiple of 128)."""
    m, k = x.shape
    xb = x.float().view(m, k // 128, 128)
    scale = xb.abs().amax(dim=-1).clamp(min=1e-12) / 448.0
    return (xb / scale[..., None]).view(m, k).to(FP8), scale


def first(r):
    """torch 2.1-2.3's _scaled_mm returns (out, amax)."""
    return r[0] if isinstance(r, tuple) else r


def scaled_mm_tensor(a8, a_scale, w, one):
    return first(torch._scaled_mm(a8, w.t(), scale_a=a_scale, scale_b=one, out_dtype=torch.bfloat16))


def block_scale_b(s):
    """The weight's [N/128][K/128] scales as the 128x128 recipe takes them: K blocks padded to a
    multiple of 4, then viewed [K/128][N/128] (outer-dim-major)."""
    kb = s.shape[1]
    if kb % 4:
        s = F.pad(s, (0, 4 - kb % 4))
    return s.contiguous().t()


def scaled_mm_block(a8, a_scale_cm, w, sb):
    """a_scale_cm: [M][K/128] column-major; sb from block_scale_b."""
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        st = F.ScalingType
        return F.scaled_mm(a8, w.t(), a_scale_cm, st.BlockWise1x128, sb, st.BlockWise128x128,
                           output_dtype=torch.bfloat16)
    return first(torch._scaled_mm(a8, w.t(), scale_a=a_scale_cm, scale_b=sb, out_dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# Weights


def e4m3_value(b):
    """Slow reference: the float of one float8_e4m3fn byte (NaN for 0x7f / 0xff)."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m / 8.0 * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def e4m3_table():
    return torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float32)


def random_fp8(shape, device, gen_table=None):
    """Random e4m3 weights (finite, |w| <= 448). Without a float8 dtype (--cpu-smoke on an old torch)
    the e4m3 values of random bytes as fp32."""
    if FP8 is not None:
        return (torch.randn(shape, device=device) * 64).clamp(-448, 448).to(FP8)
    b = torch.randint(0, 256, shape, device=device)
    b = torch.where((b & 0x7F) == 0x7F, b - 1, b)  # no NaN
    return gen_table.to(device)[b]


def random_block_scales(n, k, device, copies=None):
    shape = ((copies,) if copies else ()) + (math.ceil(n / 128), math.ceil(k / 128))
    # powers of two around 2^-10, as UE8M0 scales are
    return torch.exp2(torch.randint(-14, -6, shape, device=device).float())


def fp8_weight_bytes(n, k):
    return n * k + math.ceil(n / 128) * math.ceil(k / 128) * 4


def fp4_expert_bytes(d, inter):
    """w1, w3 [inter][d] and w2 [d][inter]: packed bytes + one scale byte per 32."""
    return 3 * (inter * d // 2 + inter * d // 32)


# ---------------------------------------------------------------------------------------------
# Timing


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, fn, runs, warmup, prep=None):
        """Median microseconds of fn(i) over `runs` runs after `warmup`; prep(i) runs untimed before
        run i."""
        i = 0
        for _ in range(warmup):
            if prep:
                prep(i)
            fn(i)
            i += 1
        self.sync()
        if self.cuda:
            ev = []
            for _ in range(runs):
                if prep:
                    prep(i)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(i)
                b.record()
                ev.append((a, b))
                i += 1
            torch.cuda.synchronize()
            us = [a.elapsed_time(b) * 1e3 for a, b in ev]
        else:
            us = []
            for _ in range(runs):
                if prep:
                    prep(i)
                t0 = time.perf_counter()
                fn(i)
                us.append((time.perf_counter() - t0) * 1e6)
                i += 1
        return statistics.median(us)

    def graph(self, fn, calls, replays=5):
        """Microseconds per call of fn(0..calls-1) captured in one CUDA graph and replayed (the
        median of `replays` replays): the GPU's time without the host's launch gaps, as
        bench_gpu_gemm and the engine's decode graphs run. None off CUDA."""
        if not self.cuda:
            return None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(0)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        g.replay()
        us = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            us.append(a.elapsed_time(b) * 1e3 / calls)
        del g
        return statistics.median(us)

    def graph_once(self, fn, flush):
        """Microseconds of one fn() captured in a graph: replayed once to load it, L2 flushed by
        zeroing `flush`, then replayed between events."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        del g
        return a.elapsed_time(b) * 1e3


def free_memory(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Self-check: the plain math against slow references (also the whole of --cpu-smoke)


def close(a, b, rtol=1e-2, atol=1e-2):
    return torch.allclose(a.float().cpu(), b.float().cpu(), rtol=rtol, atol=atol)


def self_check(device):
    """Returns {name: 'ok' | 'n/a (...)' | 'wrong'}; failures of the plain paths make 'ok' False."""
    res = {}
    torch.manual_seed(1)
    et = e4m3_table()
    # float8_e4m3fn's own decoding against the bit-level reference
    if FP8 is not None:
        got = torch.arange(256, dtype=torch.uint8).view(FP8).float()
        res["e4m3 decode"] = "ok" if torch.equal(torch.isnan(got), torch.isnan(et)) and torch.equal(
            torch.nan_to_num(got), torch.nan_to_num(et)) else "wrong"
    # spot values of the reference itself
    spots = {0x00: 0.0, 0x38: 1.0, 0x7E: 448.0, 0x01: 2.0 ** -9, 0xC0: -2.0, 0x3C: 1.5}
    res["e4m3 reference"] = "ok" if all(e4m3_value(b) == v for b, v in spots.items()) else "wrong"

    # block-scaled fp8 dequant: divisible and ragged shapes, against a per-element loop
    ok = True
    for n, k in ((256, 384), (200, 300)):
        w = random_fp8((n, k), device, et)
        s = torch.exp2(torch.randint(-8, 4, (math.ceil(n / 128), math.ceil(k / 128)), device=device).float())
        got = dequant_fp8(w, s).float().cpu()
        wf, sc = w.float().cpu(), s.cpu()
        for _ in range(200):
            i, j = int(torch.randint(0, n, ())), int(torch.randint(0, k, ()))
            ref = torch.tensor(float(wf[i, j]) * float(sc[i // 128, j // 128])).bfloat16().float()
            ok &= float(got[i, j]) == float(ref)
        x = torch.randn(5, k, device=device).bfloat16()
        ref = x.float().cpu() @ (wf * sc.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]).t()
        ok &= close(linear_dequant(x, w, s), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    res["fp8 block dequant"] = "ok" if ok else "wrong"

    # fp4 dequant against per-nibble decoding
    ok = True
    tables = fp4_tables(device)
    n, k = 24, 96
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
    sbytes = torch.randint(100, 140, (n, k // 32), dtype=torch.uint8, device=device)
    got = dequant_fp4(packed, sbytes, tables).float().cpu()
    pc, sc = packed.cpu(), sbytes.cpu()
    for i in range(n):
        for j in range(k):
            byte = int(pc[i, j // 2])
            nib = byte & 15 if j % 2 == 0 else byte >> 4
            ref = E2M1[nib] * 2.0 ** (int(sc[i, j // 32]) - 127)
            ok &= float(got[i, j]) == ref
    ok &= float(got[0, 0]) == E2M1[int(pc[0, 0]) & 15] * 2.0 ** (int(sc[0, 0]) - 127)
    res["fp4 dequant"] = "ok" if ok else "wrong"

    # the MoE forward against a per-token loop in fp32
    n_exp, topk, d, inter, rs = MODELS["tiny"][1]
    t = 7
    ex = make_experts(n_exp, d, inter, 1, device)
    experts = [m[0] for m in ex]
    x = torch.randn(t, d, device=device).bfloat16()
    logits = torch.randn(t, n_exp, device=device)
    bias = torch.randn(n_exp, device=device) * 0.1
    hits = []
    y = moe_plain(x, logits, bias, topk, rs, experts, tables, hits).float().cpu()
    counts = torch.bincount(route(logits, bias, topk, rs)[0].flatten(), minlength=n_exp).tolist()
    y2 = moe_plain(x, logits, bias, topk, rs, experts, tables, counts=counts).float().cpu()
    ids, wts = route(logits, bias, topk, rs)
    w1, s1, w3, s3, w2, s2 = experts
    ref = torch.zeros(t, d)
    for ti in range(t):
        xf = x[ti].float().cpu()
        for j in range(topk):
            e = int(ids[ti, j])
            a = dequant_fp4(w1[e], s1[e], tables).float().cpu()
            b = dequant_fp4(w3[e], s3[e], tables).float().cpu()
            c = dequant_fp4(w2[e], s2[e], tables).float().cpu()
            h = F.silu(a @ xf) * (b @ xf)
            ref[ti] += float(wts[ti, j]) * (c @ h)
    ok = close(y, ref, rtol=5e-2, atol=5e-2 * float(ref.abs().max()))
    ok &= hits[0] == len(set(ids.flatten().tolist())) and torch.equal(y, y2)
    res["moe plain"] = "ok" if ok else "wrong"

    # PyTorch's fp8 GEMMs, only where they exist (CUDA, torch >= 2.1)
    if device.type == "cuda" and FP8 is not None:
        n, k, m = 256, 512, 16
        w = random_fp8((n, k), device)
        s = random_block_scales(n, k, device)
        x = torch.randn(m, k, device=device).bfloat16()
        try:
            a8, asc = quantize_tensor(x)
            one = torch.ones((), device=device)
            got = scaled_mm_tensor(a8, asc, w, one)
            ref = (a8.float() * asc) @ w.float().t()
            res["_scaled_mm tensor"] = "ok" if close(got, ref, 2e-2, 2e-2 * float(ref.abs().max())) else "wrong"
        except Exception as exc:  # noqa: BLE001
            res["_scaled_mm tensor"] = "n/a (%s)" % short(exc)
        try:
            a8, asc = quantize_1x128(x)
            got = scaled_mm_block(a8, asc.t().contiguous().t(), w, block_scale_b(s))
            ref = (a8.float().view(m, k // 128, 128) * asc[..., None]).view(m, k) @ dequant_fp8(w, s).float().t()
            res["_scaled_mm block"] = "ok" if close(got, ref, 2e-2, 2e-2 * float(ref.abs().max())) else "wrong"
        except Exception as exc:  # noqa: BLE001
            res["_scaled_mm block"] = "n/a (%s)" % short(exc)
    return res


def short(exc):
    msg = str(exc).strip().splitlines()
    return (type(exc).__name__ + ": " + (msg[0] if msg else ""))[:90]


# ---------------------------------------------------------------------------------------------
# Benchmarks


def bench_ceilings(device, timer, quick, runs):
    out = {}
    # the host's cost of one eager op: what bounds every eager time at decode sizes
    one = torch.zeros(1, device=device)
    for _ in range(10):
        one.add_(1)
    timer.sync()
    ops = 2000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(ops):
        one.add_(1)
    b.record()
    b.synchronize()
    out["launch"] = a.elapsed_time(b) * 1e3 / ops
    print("ceiling  eager launch: %.1f us per op (%d one-element adds back to back; host-bound)" % (out["launch"], ops))
    size = (2 if quick else 4) * GiB
    try:
        a = torch.empty(size, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        a.fill_(1)
        us = timer.run(lambda i: b.copy_(a), max(10, runs // 2), 3)
        out["hbm"] = 2 * size / (us * 1e-6)
        print("ceiling  HBM copy %d GiB (bytes = 2 x size)   %7.2f TB/s" % (size // GiB, out["hbm"] / 1e12))
        del a, b
    except OOM:
        print("ceiling  HBM copy: oom")
    free_memory(device)
    n = 8192
    try:
        a = torch.randn(n, n, device=device).bfloat16()
        b = torch.randn(n, n, device=device).bfloat16()
        us = timer.run(lambda i: a @ b, max(10, runs // 2), 3)
        out["bf16"] = 2 * n ** 3 / (us * 1e-6)
        print("ceiling  bf16 matmul %d^3                 %7.0f TFLOP/s" % (n, out["bf16"] / 1e12))
        try:
            a8, b8 = a.to(FP8), b.to(FP8)
            one = torch.ones((), device=device)
            w8 = b8.t().contiguous()  # as a weight [N][K]: a8 @ w8.T = a8 @ b8
            us = timer.run(lambda i: scaled_mm_tensor(a8, one, w8, one), max(10, runs // 2), 3)
            out["fp8"] = 2 * n ** 3 / (us * 1e-6)
            print("ceiling  fp8 _scaled_mm %d^3 (tensor)     %7.0f TFLOP/s" % (n, out["fp8"] / 1e12))
        except Exception as exc:  # noqa: BLE001
            print("ceiling  fp8 _scaled_mm: n/a (%s)" % short(exc))
    except OOM:
        print("ceiling  bf16 matmul: oom")
    free_memory(device)
    return out


def fmt_row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def gbs(nbytes, us):
    return "-" if us is None else "%.0f" % (nbytes / (us * 1e-6) / 1e9)


def tflops(flops, us):
    return "-" if us is None else "%.1f" % (flops / (us * 1e-6) / 1e12)


def fmt_us(us):
    return "-" if us is None else "%.1f" % us


def graph_us(timer, fn, calls):
    """timer.graph, or None (with the reason printed) where capture fails."""
    try:
        return timer.graph(fn, calls)
    except OOM:
        raise
    except Exception as exc:  # noqa: BLE001
        print("  (graph capture failed: %s)" % short(exc))
        return None


def bench_dense(model, shapes, rows, device, timer, runs, warmup, checks, summary):
    """Prints the detail rows; fills summary[(label, path)][M] = (us, GB/s, TFLOP/s) eager and graph."""
    failed = False
    et = e4m3_table()
    empty = ["", "", "", "", ""]
    for op, n, k in shapes:
        label = "%s %s %dx%d" % (model, op, n, k)
        wbytes = fp8_weight_bytes(n, k)
        copies = max(2, -(-ROTATE_BYTES // wbytes))
        try:
            ws = torch.stack([random_fp8((n, k), device, et) for _ in range(min(copies, 8))])
            if copies > ws.shape[0]:  # more copies: repeat the random ones (L2 sees distinct addresses)
                ws = ws.repeat(-(-copies // ws.shape[0]), 1, 1)[:copies].contiguous()
            ss = random_block_scales(n, k, device, copies)
        except OOM:
            print(fmt_row([label, "-", "all", "oom"] + empty))
            free_memory(device)
            continue
        xmax = torch.randn(max(rows), k, device=device).bfloat16()
        paths = ["dequant+bf16", "bf16 stored", "_scaled_mm tensor", "_scaled_mm block"]
        for path in paths:
            if path.startswith("_scaled_mm") and checks.get(path) != "ok":
                print(fmt_row([label, path, "all", checks.get(path, "n/a")] + empty))
                continue
            state = {}
            try:
                ncopies = copies
                if path == "bf16 stored":
                    ncopies = max(2, -(-ROTATE_BYTES // (2 * n * k)))
                    state["wb"] = torch.stack([dequant_fp8(ws[c % copies], ss[c % copies]) for c in range(ncopies)])
                    stored = 2 * n * k
                elif path == "_scaled_mm tensor":
                    state["one"] = torch.ones((), device=device)
                    stored = n * k
                elif path == "_scaled_mm block":
                    state["sb"] = [block_scale_b(ss[c]) for c in range(copies)]
                    stored = wbytes
                else:
                    stored = wbytes
                for m in rows:
                    x = xmax[:m]
                    if path == "dequant+bf16":
                        fn = lambda i, x=x: linear_dequant(x, ws[i % copies], ss[i % copies])  # noqa: E731
                    elif path == "bf16 stored":
                        wb = state["wb"]
                        fn = lambda i, x=x, wb=wb: x @ wb[i % wb.shape[0]].t()  # noqa: E731
                    elif path == "_scaled_mm tensor":
                        a8, asc = quantize_tensor(x)
                        fn = lambda i, a8=a8, asc=asc: scaled_mm_tensor(a8, asc, ws[i % copies], state["one"])  # noqa: E731
                    else:
                        mp = -(-m // 4) * 4
                        xp = F.pad(x, (0, 0, 0, mp - m)) if mp != m else x
                        a8, asc = quantize_1x128(xp)
                        asc = asc.t().contiguous().t()
                        fn = lambda i, a8=a8, asc=asc: scaled_mm_block(a8, asc, ws[i % copies], state["sb"][i % copies])  # noqa: E731
                    try:
                        us = timer.run(fn, runs, warmup)
                        # every copy at least once per replay, so a replay's reads all miss L2
                        gus = graph_us(timer, fn, max(runs, ncopies))
                    except OOM:
                        print(fmt_row([label, path, m, "oom"] + empty))
                        free_memory(device)
                        continue
                    except Exception as exc:  # noqa: BLE001
                        if not path.startswith("_scaled_mm"):
                            raise
                        print(fmt_row([label, path, m, "n/a (%s)" % short(exc)] + empty))
                        continue
                    flops = 2 * m * n * k
                    e = (us, gbs(stored, us), tflops(flops, us))
                    g = (gus, gbs(stored, gus), tflops(flops, gus))
                    print(fmt_row([label, path, m, fmt_us(us), e[1], e[2], fmt_us(gus), g[1], g[2]]), flush=True)
                    summary.setdefault((label, path), {})[m] = (e, g)
            except OOM:
                print(fmt_row([label, path, "all", "oom"] + empty))
            except Exception as exc:  # noqa: BLE001
                print(fmt_row([label, path, "all", "error: " + short(exc)] + empty))
                if not path.startswith("_scaled_mm"):
                    failed = True
            state.clear()
            free_memory(device)
        ws = ss = xmax = None
        free_memory(device)
    return failed


def make_experts(n_exp, d, inter, copies, device):
    """[w1, s1, w3, s3, w2, s2] with a leading copy dimension on each."""
    def packed(o, i):
        return torch.empty((copies, n_exp, o, i // 2), dtype=torch.uint8, device=device).random_(0, 256)

    def scales(o, i):
        # 2^-9 .. 2^-4: values the size of real expert weights
        return torch.empty((copies, n_exp, o, i // 32), dtype=torch.uint8, device=device).random_(118, 124)
    return [packed(inter, d), scales(inter, d), packed(inter, d), scales(inter, d), packed(d, inter), scales(d, inter)]


def bench_moe(model, cfg, tokens, device, timer, runs, warmup, graph_runs, summary):
    n_exp, topk, d, inter, rs = cfg
    label = "%s MoE %dx(%dx%d) top-%d" % (model, n_exp, inter, d, topk)
    path = "dequant+bf16 loop"
    empty = ["", "", "", "", ""]
    per_expert = fp4_expert_bytes(d, inter)
    per_copy = n_exp * per_expert
    copies = 2
    if device.type == "cuda":
        free = torch.cuda.mem_get_info()[0]
        # keep room for the dequantized experts, activations and routing of 4096 tokens
        if copies * per_copy > free - 12 * GiB:
            copies = 1
    try:
        ex = make_experts(n_exp, d, inter, copies, device)
        flush = torch.empty(ROTATE_BYTES, dtype=torch.uint8, device=device)
    except OOM:
        print(fmt_row([label, path, "all", "-", "oom"] + empty))
        free_memory(device)
        return False
    tables = fp4_tables(device)
    bias = torch.randn(n_exp, device=device) * 0.1
    failed = False
    for t in tokens:
        try:
            x = torch.randn(t, d, device=device).bfloat16()
            cur = {}
            hits = []

            def prep(i, t=t):
                cur["logits"] = torch.randn(t, n_exp, device=device)

            def fn(i, x=x):
                c = i % copies
                moe_plain(x, cur["logits"], bias, topk, rs, [m[c] for m in ex], tables, hits)

            us = timer.run(fn, runs, warmup, prep)
            hit = statistics.mean(hits[warmup:]) if len(hits) > warmup else float(hits[-1])
            # graph: the same forward with this run's per-expert counts read beforehand (untimed),
            # captured and replayed once from a flushed L2; a new capture for each run's routing
            gus, ghit = None, None
            if device.type == "cuda" and graph_runs:
                try:
                    gl, gh = [], []
                    for r in range(graph_runs):
                        logits = torch.randn(t, n_exp, device=device)
                        counts = torch.bincount(route(logits, bias, topk, rs)[0].flatten(), minlength=n_exp).tolist()
                        gh.append(sum(1 for c in counts if c))
                        w = [m[r % copies] for m in ex]
                        gl.append(timer.graph_once(
                            lambda logits=logits, counts=counts, w=w: moe_plain(x, logits, bias, topk, rs, w, tables, counts=counts),
                            flush))
                    gus, ghit = statistics.median(gl), statistics.mean(gh)
                except OOM:
                    raise
                except Exception as exc:  # noqa: BLE001
                    print("  (graph capture failed: %s)" % short(exc))
            flops = 2 * t * topk * 3 * inter * d
            e = (us, gbs(hit * per_expert, us), tflops(flops, us))
            g = (gus, gbs((ghit or 0) * per_expert, gus), tflops(flops, gus))
            print(fmt_row([label, path, t, "%.1f" % hit, fmt_us(us), e[1], e[2], fmt_us(gus), g[1], g[2]]), flush=True)
            summary.setdefault((label, path), {})[t] = (e, g)
        except OOM:
            print(fmt_row([label, path, t, "-", "oom"] + empty))
        except Exception as exc:  # noqa: BLE001
            print(fmt_row([label, path, t, "-", "error: " + short(exc)] + empty))
            failed = True
        cur = x = None
        free_memory(device)
    ex = flush = None
    free_memory(device)
    return failed


def print_summary(summary, keys, cols, col_name, title):
    """Cells: eager us / graph us (graph '-' where not measured)."""
    if not keys:
        return
    head = ["torch floor: " + title, "path"] + ["%s=%d us" % (col_name, c) for c in cols]
    head += ["GB/s at %s=%d" % (col_name, cols[0]), "TFLOP/s at %s=%d" % (col_name, cols[-1])]
    print(fmt_row(head))
    print("|" + "---|" * len(head))

    def pair(d, c, j):
        if c not in d:
            return "-"
        (e, g) = d[c]
        val = (fmt_us(e[0]), fmt_us(g[0])) if j == 0 else (e[j], g[j])
        return "%s / %s" % val

    for label, path in keys:
        d = summary[(label, path)]
        cells = ["torch " + label, path] + [pair(d, c, 0) for c in cols]
        cells += [pair(d, cols[0], 1), pair(d, cols[-1], 2)]
        print(fmt_row(cells))


def parse_ints(s):
    return [int(v) for v in s.split(",") if v.strip()]


def main():
    global ROTATE_BYTES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 timed runs instead of 50, a 2 GiB copy")
    ap.add_argument("--shapes", default="flash,pro", help="models: flash,pro")
    ap.add_argument("--rows", default="1,8,64,128,4096", help="dense rows M")
    ap.add_argument("--tokens", default="1,16,64,256,4096", help="MoE tokens")
    ap.add_argument("--runs", type=int, default=0, help="timed runs per case (default 50, --quick 10)")
    ap.add_argument("--parts", default="dense,moe", help="dense,moe")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.cpu_smoke:
        ROTATE_BYTES = 1 * MiB
        device = torch.device("cpu")
        models, rows, tokens, runs, warmup, graph_runs = ["tiny"], [1, 3, 16], [1, 5, 32], 3, 1, 0
    else:
        if not torch.cuda.is_available():
            print("torch_floor: no CUDA device visible to torch %s (torch.cuda.is_available() is False); "
                  "this benchmark needs a GPU" % torch.__version__, file=sys.stderr)
            return 2
        device = torch.device("cuda")
        models = [m.strip() for m in args.shapes.split(",") if m.strip()]
        for m in models:
            if m not in ("flash", "pro"):
                ap.error("unknown model %r (flash, pro)" % m)
        rows, tokens = parse_ints(args.rows), parse_ints(args.tokens)
        runs = args.runs or (10 if args.quick else 50)
        warmup = 2 if args.quick else 5
        graph_runs = 3 if args.quick else 5
    parts = set(p.strip() for p in args.parts.split(","))
    timer = Timer(device)
    t_start = time.time()

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        print("device: %s (%d SMs, %.0f GiB), torch %s, CUDA %s" % (
            p.name, p.multi_processor_count, p.total_memory / GiB, torch.__version__, torch.version.cuda))
    else:
        print("device: cpu (--cpu-smoke: tiny shapes, the math checked; times mean nothing), torch %s" % torch.__version__)
    print("timing: eager = median of %d runs after %d warm-up (%s; the host's launch gaps count); graph = the same "
          "calls captured in a CUDA graph and replayed (dense: per call, median of 5 replays of >= %d calls; "
          "MoE: median of %d runs, each its own routing, replayed from a flushed L2); dense weights rotated over "
          ">= %d MiB of copies, MoE over 2 copies of all experts + fresh routing each run"
          % (runs, warmup, "CUDA events" if device.type == "cuda" else "perf_counter", runs, graph_runs,
             ROTATE_BYTES // MiB))

    checks = self_check(device)
    bad = [k for k, v in checks.items() if v == "wrong" and not k.startswith("_scaled_mm")]
    print("self-check: " + ", ".join("%s %s" % kv for kv in checks.items()))
    failed = bool(bad)
    if bad:
        print("torch_floor: self-check FAILED for %s" % ", ".join(bad))
    print()

    ceil = {}
    if device.type == "cuda":
        ceil = bench_ceilings(device, timer, args.quick, runs)
        print()

    summary = {}
    if "dense" in parts:
        print("## dense FP8 block-scaled linear (GB/s on the stored weight bytes: fp8 + fp32 block scales; "
              "bf16 stored: 2 bytes per weight)")
        print(fmt_row(["op", "path", "M", "us", "GB/s", "TFLOP/s", "graph us", "graph GB/s", "graph TFLOP/s"]))
        print("|---|---|---|---|---|---|---|---|---|")
        for m in models:
            failed |= bench_dense(m, MODELS[m][0], rows, device, timer, runs, warmup, checks, summary)
        print()
    if "moe" in parts:
        print("## MoE FP4 experts, plain (GB/s on the touched experts' fp4 bytes + scale bytes; "
              "TFLOP/s on the routed tokens' 3 products)")
        print(fmt_row(["op", "path", "tokens", "experts hit", "us", "GB/s", "TFLOP/s", "graph us", "graph GB/s",
                       "graph TFLOP/s"]))
        print("|---|---|---|---|---|---|---|---|---|---|")
        for m in models:
            failed |= bench_moe(m, MODELS[m][1], tokens, device, timer, runs, warmup, graph_runs, summary)
        print()

    # compact summary: dequant+bf16 and the best-checked _scaled_mm path; MoE; ceilings
    scaled = "_scaled_mm block" if checks.get("_scaled_mm block") == "ok" else "_scaled_mm tensor"
    dense_keys = [key for key in summary if "MoE" not in key[0] and key[1] in ("dequant+bf16", scaled)]
    moe_keys = [key for key in summary if "MoE" in key[0]]
    print("## summary (each cell: eager / CUDA graph)")
    print_summary(summary, dense_keys, rows, "M", "dense fp8")
    print_summary(summary, moe_keys, tokens, "T", "MoE fp4")
    if ceil:
        print(fmt_row(["torch ceiling", "eager launch %.1f us/op" % ceil.get("launch", 0),
                       "HBM copy %.2f TB/s" % (ceil.get("hbm", 0) / 1e12),
                       "bf16 matmul 8192^3 %.0f TFLOP/s" % (ceil.get("bf16", 0) / 1e12),
                       "fp8 _scaled_mm 8192^3 %s" % ("%.0f TFLOP/s" % (ceil["fp8"] / 1e12) if "fp8" in ceil else "n/a")]))
    print("torch_floor: %s in %.0f s" % ("FAILED" if failed else "done", time.time() - t_start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
