"""How the kernel tests compare a kernel's output with the float64 reference: the tolerances per
dtype, fresh random inputs whose seed goes in the message, and an element-by-element check."""

from __future__ import annotations

import random

import torch

# |out - ref| <= RTOL * |ref| + ATOL * max|ref over the row|. bf16 output rounding alone is up to
# 2**-8 of a value; fp32 is limited by fp32 accumulation over long contexts (~3e-6 of the row).
TOLERANCE = {
    torch.float32: (1e-4, 2e-5),
    torch.bfloat16: (2.0**-7, 1e-3),
    torch.float16: (2.0**-9, 5e-4),
}


def fresh_generator() -> tuple[torch.Generator, int]:
    seed = random.SystemRandom().randrange(2**31)
    return torch.Generator().manual_seed(seed), seed


def check_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: NaN in output"
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    rtol, atol = TOLERANCE[dtype]
    err = (out.double() - ref).abs()
    row_max = ref.abs().amax(dim=-1, keepdim=True)
    bound = rtol * ref.abs() + atol * row_max
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {out.numel()} elements off; first at {idx}: "
            f"got {float(out[idx]):.6g}, want {float(ref[idx]):.6g}; "
            f"max err/row max {float((err / row_max.clamp_min(1e-30)).max()):.3g}"
        )
