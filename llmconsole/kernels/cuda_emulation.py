"""A CPU model of the CUDA decode kernel (csrc/paged_attention.cu), warp by warp and lane by lane.

No GPU is needed to check what the kernel computes, only to time it. This module walks the
kernel's own index arithmetic, in the order the kernel does it, on CPU tensors:

- the grid: one CTA per (sequence, KV head, head tile) and split, the split count from the same
  chooser (choose_splits) and each sequence's 16-token-aligned part of its context;
- per warp, the tiles it owns, the block-table entries fetched 32 tiles at a time and shuffled
  out, the cp.async copies of each K/V row (element offsets from the caches' own strides, rows
  past the context zero-filled) into the swizzled ring of stages, with the copies landing only
  at the matching cp.async.wait_group: until then their bytes read as NaN;
- ldmatrix (.x4, .x2, .trans) and mma.m16n8k16 with the fragment layouts of the PTX ISA,
  movmatrix.trans, the online softmax per head column with its shuffles, the hi/lo split of P;
- the CTA's combine of its warps in shared memory, the split's partial output and log-sum-exp,
  and the merge kernel.

Shared memory starts as NaN and global memory is read only through offsets the kernel computes,
counted per element: a read outside a context, of a stage before it landed or of a slot never
written shows up in the result, and `DecodeTrace` says how often each K/V element was read (the
kernel's design reads each one once per head tile). The constants (tile, stages, shared memory
per warp, ...) mirror the .cu file's Geometry; the CPU suite compares them, and the split
chooser, with the compiled library's own answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

TILE = 16
MAX_SPLITS = 256
DEFAULT_THREADS = 128
DEFAULT_STAGE_BYTES = 24576
DEFAULT_MIN_PARTITION = 128
LOG2E = 1.4426950408889634
FP8_DTYPES = (torch.float8_e4m3fn, torch.uint8)


@dataclass(frozen=True)
class KernelGeometry:
    """The compile-time geometry of one decode kernel instantiation (the .cu's Geometry)."""

    head_size: int
    kv_bytes: int  # bytes per cached element: 2, or 1 for fp8
    nt: int  # n-tiles of 8 query heads
    tile: int
    warps: int
    stages: int
    heads_per_cta: int
    q_in_smem: bool
    warp_bytes: int  # each warp's ring of stages (+ the fp8 work tile)
    cta_bytes: int  # dynamic shared memory per CTA
    min_partition: int
    max_splits: int
    static_bytes: int  # static shared memory (the warps' softmax statistics)

    @property
    def kv_tile_bytes(self) -> int:
        return self.tile * self.head_size * self.kv_bytes

    @property
    def stage_bytes(self) -> int:
        return 2 * self.kv_tile_bytes

    @property
    def chunks_per_row(self) -> int:
        return self.head_size * self.kv_bytes // 16

    @property
    def o_stride(self) -> int:
        return self.head_size + 4

    def library_values(self) -> list[int]:
        """The order llmc_paged_attention_geometry() reports them in."""
        return [
            self.tile,
            self.warps,
            self.stages,
            self.heads_per_cta,
            int(self.q_in_smem),
            self.warp_bytes,
            self.cta_bytes,
            self.min_partition,
            self.max_splits,
            self.static_bytes,
        ]


def heads_per_cta(group: int) -> int:
    return 8 if group <= 8 else 16


def head_tiles(group: int) -> int:
    return -(-group // heads_per_cta(group))


def kernel_geometry(
    head_size: int,
    group: int,
    kv_bytes: int = 2,
    threads: int = DEFAULT_THREADS,
    stage_bytes: int = DEFAULT_STAGE_BYTES,
    min_partition: int = DEFAULT_MIN_PARTITION,
) -> KernelGeometry:
    nt = 1 if group <= 8 else 2
    heads = 8 * nt
    kv_tile = TILE * head_size * kv_bytes
    work = 2 * TILE * head_size * 2 if kv_bytes == 1 else 0
    fit = int((stage_bytes - work) / (2 * kv_tile))  # C++ division truncates toward zero
    stages = min(4, max(2, fit))
    warp_bytes = stages * 2 * kv_tile + work
    warps = threads // 32
    return KernelGeometry(
        head_size=head_size,
        kv_bytes=kv_bytes,
        nt=nt,
        tile=TILE,
        warps=warps,
        stages=stages,
        heads_per_cta=heads,
        q_in_smem=head_size * nt >= 512,
        warp_bytes=warp_bytes,
        cta_bytes=warps * warp_bytes + heads * head_size * 2,
        min_partition=min_partition,
        max_splits=MAX_SPLITS,
        static_bytes=4 * 2 * warps * heads,
    )


def choose_splits(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    max_context_len: int,
    sm_count: int,
    ctas_per_sm: int,
    min_partition: int = DEFAULT_MIN_PARTITION,
) -> int:
    """The kernel's split count (llmc_paged_attention_choose_splits), line for line."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        return 1
    tiles = head_tiles(num_heads // num_kv_heads)
    if num_seqs <= 0 or max_context_len <= 0:
        return 1
    base = num_seqs * num_kv_heads * tiles
    slots = (sm_count if sm_count > 0 else 1) * (ctas_per_sm if ctas_per_sm > 0 else 1)
    cap = min(-(-max_context_len // min_partition), MAX_SPLITS)
    if cap <= 1 or base * 10 >= slots * 8:
        return 1

    def efficiency(s: int) -> float:
        ctas = base * s
        waves = -(-ctas // slots)
        return ctas / (waves * slots)

    best = max(efficiency(s) for s in range(1, cap + 1))
    for s in range(1, cap + 1):
        if efficiency(s) >= 0.9 * best:
            return s
    return cap


def split_tokens(length: int, num_splits: int) -> int:
    per = -(-length // num_splits)
    return -(-per // TILE) * TILE


def workspace_bytes(num_seqs: int, num_heads: int, head_size: int, num_splits: int) -> int:
    if num_splits <= 1 or num_seqs <= 0:
        return 0
    rows = num_seqs * num_heads * num_splits
    return 4 * (rows * head_size + rows)


# ---- the warp's instructions --------------------------------------------------------------------

LANES = torch.arange(32)
_G = LANES >> 2  # fragment row group
_T = LANES & 3  # thread in group: column pair


def swz(head_size: int, row: torch.Tensor | int, chunk: torch.Tensor | int) -> torch.Tensor:
    """Byte offset of a 16-byte chunk in a swizzled 16-bit tile (the .cu's swz<D>)."""
    row_t = torch.as_tensor(row)
    return row_t * (head_size * 2) + ((torch.as_tensor(chunk) ^ (row_t & 7)) << 4)


def _fragment_tables() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    e = torch.arange(2)
    g, t = _G[:, None], _T[:, None]
    a_rows = torch.stack([g + 0 * e, g + 8 + 0 * e, g + 0 * e, g + 8 + 0 * e])
    a_cols = torch.stack([2 * t + e, 2 * t + e, 2 * t + 8 + e, 2 * t + 8 + e])
    b_rows = torch.stack([2 * t + e, 2 * t + 8 + e])
    b_cols = torch.stack([g + 0 * e, g + 0 * e])
    c_rows = torch.stack([_G, _G, _G + 8, _G + 8], dim=1)
    c_cols = torch.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], dim=1)
    return {"a": (a_rows, a_cols), "b": (b_rows, b_cols), "c": (c_rows, c_cols)}


_FRAG = _fragment_tables()


def mma_m16n8k16(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """D = A B + C with the PTX fragment layouts: a [4, 32, 2] (a0..a3 per lane, low half first),
    b [2, 32, 2], c [32, 4] fp32. Products and sums in float64, rounded once to fp32."""
    mat_a = torch.zeros(16, 16, dtype=torch.float64)
    mat_a[_FRAG["a"]] = a.double()
    mat_b = torch.zeros(16, 8, dtype=torch.float64)
    mat_b[_FRAG["b"]] = b.double()
    mat_c = torch.zeros(16, 8, dtype=torch.float64)
    mat_c[_FRAG["c"]] = c.double()
    return (mat_a @ mat_b + mat_c).float()[_FRAG["c"]]


def _matrix_rows(smem: torch.Tensor, lane_addr: torch.Tensor, count: int) -> torch.Tensor:
    """The 8 x 8 16-bit matrices an ldmatrix reads: matrix m's row r from lane 8m + r's address."""
    addr = lane_addr[: 8 * count]
    if bool((addr % 16 != 0).any()):
        raise AssertionError("ldmatrix row address not 16-byte aligned")
    return smem[addr[:, None] + 2 * torch.arange(8)].view(count, 8, 8)


def ldmatrix(smem: torch.Tensor, lane_addr: torch.Tensor, count: int, trans: bool) -> torch.Tensor:
    """ldmatrix.sync.aligned.m8n8.x{count}[.trans].b16 -> [count, 32, 2]: lane l gets row l/4,
    columns 2(l%4), +1 of each matrix, or with .trans the elements (2(l%4), l/4), (2(l%4)+1, l/4)."""
    mats = _matrix_rows(smem, lane_addr, count)
    e = torch.arange(2)
    if trans:
        return mats[:, 2 * _T[:, None] + e, _G[:, None]]
    return mats[:, _G[:, None], 2 * _T[:, None] + e]


def movmatrix_trans(x: torch.Tensor) -> torch.Tensor:
    """movmatrix.sync.aligned.m8n8.trans.b16 on a [32, 2] fragment."""
    mat = torch.empty(8, 8)
    e = torch.arange(2)
    mat[_G[:, None], 2 * _T[:, None] + e] = x
    return mat.t()[_G[:, None], 2 * _T[:, None] + e]


def shfl_xor(x: torch.Tensor, mask: int) -> torch.Tensor:
    return x[LANES ^ mask]


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


# ---- the kernel ---------------------------------------------------------------------------------


class _Global:
    """A tensor's storage as device memory: element offsets from the tensor's data pointer,
    every read counted."""

    def __init__(self, t: torch.Tensor) -> None:
        elems = t.untyped_storage().nbytes() // t.element_size()
        flat = torch.as_strided(t, (elems,), (1,), 0)
        self.values = (flat.view(torch.float8_e4m3fn) if t.dtype == torch.uint8 else flat).float()
        self.base = int(t.storage_offset())
        self.reads = torch.zeros(elems, dtype=torch.int64)

    def read(self, offsets: torch.Tensor) -> torch.Tensor:
        idx: torch.Tensor = offsets + self.base
        if bool((idx < 0).any()) or bool((idx >= self.values.numel()).any()):
            raise IndexError("global read outside the cache's storage")
        flat = idx.reshape(-1)
        self.reads.index_add_(0, flat, torch.ones_like(flat))
        return self.values[idx]


@dataclass
class DecodeTrace:
    """What one emulated launch did, for the checks the CPU suite makes."""

    num_splits: int
    head_tiles: int
    geometry: KernelGeometry
    key_reads: torch.Tensor = field(repr=False)  # reads per element of the key cache's storage
    value_reads: torch.Tensor = field(repr=False)
    out_writes: torch.Tensor = field(repr=False)  # writes per output element
    tiles: int = 0


class _Warp:
    """One warp's ring of stages and its outstanding cp.async groups."""

    def __init__(self, geom: KernelGeometry) -> None:
        self.ring = torch.full((geom.warp_bytes,), float("nan"))
        self.pending: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.group: list[tuple[torch.Tensor, torch.Tensor]] = []

    def cp_async(self, dst: torch.Tensor, values: torch.Tensor) -> None:
        self.ring[dst] = float("nan")  # in flight: undefined until waited for
        self.group.append((dst, values))

    def commit(self) -> None:
        self.pending.append(self.group)
        self.group = []

    def wait(self, allowed: int) -> None:
        while len(self.pending) > allowed:
            for dst, values in self.pending.pop(0):
                self.ring[dst] = values


def emulate_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    threads: int = DEFAULT_THREADS,
    stage_bytes: int = DEFAULT_STAGE_BYTES,
    min_partition: int = DEFAULT_MIN_PARTITION,
) -> tuple[torch.Tensor, DecodeTrace]:
    """What llmc_paged_attention_decode writes for these CPU tensors (same arguments as
    cuda_lib's paged_attention_decode), and a trace of the launch."""
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    fp8 = key_cache.dtype in FP8_DTYPES
    geom = kernel_geometry(head_size, group, 1 if fp8 else 2, threads, stage_bytes, min_partition)
    tiles_per_head = head_tiles(group)
    mma_dtype = torch.float16 if fp8 else query.dtype
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")

    keys, values = _Global(key_cache), _Global(value_cache)
    out = torch.full(query.shape, float("nan"), dtype=query.dtype)
    out_writes = torch.zeros(query.shape, dtype=torch.int64)
    rows = num_seqs * num_heads * num_splits
    part_o = torch.full((rows, head_size), float("nan"))  # workspace: whatever was there
    part_lse = torch.full((rows,), float("nan"))
    trace = DecodeTrace(num_splits, tiles_per_head, geom, keys.reads, values.reads, out_writes)
    f32 = torch.float32
    scale32 = torch.tensor(scale, dtype=f32)
    s_mul = (torch.tensor(k_scale, dtype=f32) if fp8 else scale32) * torch.tensor(LOG2E, dtype=f32)
    o_mul = torch.tensor(v_scale if fp8 else 1.0, dtype=f32)
    q_values = query.float()

    for cta in range(num_seqs * num_kv_heads * tiles_per_head):
        head_tile = cta % tiles_per_head
        kv_head = (cta // tiles_per_head) % num_kv_heads
        seq = cta // (tiles_per_head * num_kv_heads)
        for split in range(num_splits):
            length = int(seq_lens[seq])
            per_split = split_tokens(length, num_splits)
            begin = split * per_split
            end = min(length, begin + per_split)
            if begin >= end and num_splits > 1:
                for h in range(geom.heads_per_cta):
                    hg = head_tile * geom.heads_per_cta + h
                    if hg < group:
                        part_lse[(seq * num_heads + kv_head * group + hg) * num_splits + split] = -math.inf
                continue
            _emulate_cta(
                geom,
                q_values,
                keys,
                values,
                key_cache.stride(),
                value_cache.stride(),
                block_tables,
                seq,
                kv_head,
                head_tile,
                split,
                num_splits,
                group,
                num_heads,
                block_size,
                length,
                begin,
                end,
                mma_dtype,
                fp8,
                scale32,
                s_mul,
                o_mul,
                out,
                out_writes,
                part_o,
                part_lse,
                trace,
            )

    if num_splits > 1:
        for row in range(num_seqs * num_heads):
            seq, head = divmod(row, num_heads)
            lse = part_lse[row * num_splits : (row + 1) * num_splits]
            top = float(torch.fmax(lse, torch.tensor(-math.inf)).max())
            weights = torch.zeros(num_splits)
            if top != -math.inf:
                live = lse != -math.inf
                weights[live] = torch.exp2(lse[live] - top)
            total = float(weights.sum())
            inv = 1.0 / total if total > 0 else 0.0
            acc = torch.zeros(head_size)
            for i in range(num_splits):
                if weights[i] > 0:
                    acc = acc + weights[i] * part_o[row * num_splits + i]
            out[seq, head] = (acc * inv).to(out.dtype)
            out_writes[seq, head] += 1
    return out, trace


def _emulate_cta(
    geom: KernelGeometry,
    q_values: torch.Tensor,
    keys: _Global,
    values: _Global,
    k_strides: tuple[int, ...],
    v_strides: tuple[int, ...],
    block_tables: torch.Tensor,
    seq: int,
    kv_head: int,
    head_tile: int,
    split: int,
    num_splits: int,
    group: int,
    num_heads: int,
    block_size: int,
    length: int,
    begin: int,
    end: int,
    mma_dtype: torch.dtype,
    fp8: bool,
    scale32: torch.Tensor,
    s_mul: torch.Tensor,
    o_mul: torch.Tensor,
    out: torch.Tensor,
    out_writes: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    trace: DecodeTrace,
) -> None:
    D, heads, nt_count = geom.head_size, geom.heads_per_cta, geom.nt
    warps = geom.warps

    # Q -> shared memory, swizzled, in the MMA type (rows past the group zero).
    q_s = torch.full((heads * D * 2,), float("nan"))
    chunk = torch.arange(heads * (D // 8))
    r, ch = chunk // (D // 8), chunk % (D // 8)
    hg = head_tile * heads + r
    rows = torch.zeros(len(chunk), 8)
    live = hg < group
    qh = kv_head * group + hg[live]
    vals = q_values[seq, qh[:, None], ch[live][:, None] * 8 + torch.arange(8)]
    if fp8:
        vals = _round(vals * scale32, mma_dtype)
    rows[live] = vals
    q_s[swz(D, r, ch)[:, None] + 2 * torch.arange(8)] = rows

    def q_fragments() -> list[list[torch.Tensor]]:
        # qf[nt][j] = [2, 32, 2]: b0, b1 of k-step j.
        frags: list[list[torch.Tensor]] = []
        for nt in range(nt_count):
            per_nt: list[torch.Tensor] = []
            for j2 in range(D // 32):
                regs = ldmatrix(q_s, swz(D, nt * 8 + (LANES & 7), 4 * j2 + (LANES >> 3)), 4, False)
                per_nt += [regs[0:2], regs[2:4]]
            frags.append(per_nt)
        return frags

    qf = None if geom.q_in_smem else q_fragments()

    num_tiles = -(-(end - begin) // TILE) if end > begin else 0
    table = block_tables[seq]
    warp_states: list[_Warp] = []
    stats_m = torch.full((warps, heads), float("nan"))
    stats_l = torch.full((warps, heads), float("nan"))
    for warp in range(warps):
        state = _Warp(geom)
        warp_states.append(state)
        my_tiles = -(-(num_tiles - warp) // warps) if num_tiles > warp else 0

        def table_entry(i: torch.Tensor, warp: int = warp, my_tiles: int = my_tiles) -> torch.Tensor:
            entries = torch.zeros(32, dtype=torch.int64)
            want = i < my_tiles
            idx = (begin + (warp + i[want] * warps) * TILE) // block_size
            if bool((idx >= table.numel()).any()):
                raise IndexError("block-table read past the row")
            entries[want] = table[idx].long()
            return entries

        blk = {"cur": table_entry(LANES), "next": table_entry(32 + LANES)}

        def issue(
            i: int,
            warp: int = warp,
            my_tiles: int = my_tiles,
            state: _Warp = state,
            table_entry: Callable[[torch.Tensor], torch.Tensor] = table_entry,
            blk: dict[str, torch.Tensor] = blk,
        ) -> None:
            if i < my_tiles:
                if i > 0 and i % 32 == 0:
                    blk["cur"] = blk["next"]
                    blk["next"] = table_entry(i + 32 + LANES)
                block = int(blk["cur"][i & 31])
                tok0 = begin + (warp + i * warps) * TILE
                valid = min(TILE, length - tok0)
                row0 = tok0 % block_size
                stage = (i % geom.stages) * geom.stage_bytes
                c = torch.arange(TILE * geom.chunks_per_row)
                row, chk = c // geom.chunks_per_row, c % geom.chunks_per_row
                ok = row < valid
                dst = row * D + chk * 16 if fp8 else swz(D, row, chk)
                elems = 16 // geom.kv_bytes
                for cache, strides, offset in ((keys, k_strides, 0), (values, v_strides, geom.kv_tile_bytes)):
                    base = block * strides[0] + row0 * strides[1] + kv_head * strides[2]
                    src = base + row[ok, None] * strides[1] + chk[ok, None] * elems + torch.arange(elems)
                    data = torch.zeros(len(c), elems)
                    data[ok] = cache.read(src)
                    addr = stage + offset + dst[:, None] + geom.kv_bytes * torch.arange(elems)
                    state.cp_async(addr.reshape(-1), data.reshape(-1))
            state.commit()

        m_run = torch.full((nt_count, 2, 32), -math.inf)
        l_run = torch.zeros(nt_count, 2, 32)
        o = torch.zeros(D // 16, nt_count, 32, 4)
        for s in range(geom.stages - 1):
            issue(s)
        for i in range(my_tiles):
            state.wait(geom.stages - 2)
            issue(i + geom.stages - 1)
            trace.tiles += 1
            stage = (i % geom.stages) * geom.stage_bytes
            k_tile, v_tile = stage, stage + geom.kv_tile_bytes
            ring = state.ring
            if fp8:
                work = geom.stages * geom.stage_bytes
                c = torch.arange(2 * TILE * geom.chunks_per_row)
                which = c // (TILE * geom.chunks_per_row)
                cc = c % (TILE * geom.chunks_per_row)
                row, chk = cc // geom.chunks_per_row, cc % geom.chunks_per_row
                raw = ring[(stage + which * geom.kv_tile_bytes + row * D + chk * 16)[:, None] + torch.arange(16)]
                wide = _round(raw, torch.float16)
                dst = work + which * (TILE * D * 2)
                ring[(dst + swz(D, row, 2 * chk))[:, None] + 2 * torch.arange(8)] = wide[:, :8]
                ring[(dst + swz(D, row, 2 * chk + 1))[:, None] + 2 * torch.arange(8)] = wide[:, 8:]
                k_tile, v_tile = work, work + TILE * D * 2
            tok0 = begin + (warp + i * warps) * TILE
            valid = min(TILE, length - tok0)

            s_acc = torch.zeros(nt_count, 32, 4)
            mi = LANES >> 3
            for j in range(D // 16):
                a = ldmatrix(ring, k_tile + swz(D, (mi & 1) * 8 + (LANES & 7), 2 * j + (mi >> 1)), 4, False)
                for nt in range(nt_count):
                    if geom.q_in_smem:
                        b = ldmatrix(q_s, swz(D, nt * 8 + (LANES & 7), 2 * j + ((LANES >> 3) & 1)), 2, False)
                    else:
                        assert qf is not None
                        b = qf[nt][j]
                    s_acc[nt] = mma_m16n8k16(s_acc[nt], a, b)

            ok0, ok1 = _G < valid, _G + 8 < valid
            neg = torch.tensor(-math.inf)
            p_hi, p_lo = [], []
            for nt in range(nt_count):
                x0 = torch.where(ok0, s_acc[nt, :, 0] * s_mul, neg)
                x1 = torch.where(ok0, s_acc[nt, :, 1] * s_mul, neg)
                x2 = torch.where(ok1, s_acc[nt, :, 2] * s_mul, neg)
                x3 = torch.where(ok1, s_acc[nt, :, 3] * s_mul, neg)
                mx0, mx1 = torch.fmax(x0, x2), torch.fmax(x1, x3)
                for mask in (4, 8, 16):
                    mx0 = torch.fmax(mx0, shfl_xor(mx0, mask))
                    mx1 = torch.fmax(mx1, shfl_xor(mx1, mask))
                mn0, mn1 = torch.fmax(m_run[nt, 0], mx0), torch.fmax(m_run[nt, 1], mx1)
                al0, al1 = torch.exp2(m_run[nt, 0] - mn0), torch.exp2(m_run[nt, 1] - mn1)
                m_run[nt, 0], m_run[nt, 1] = mn0, mn1
                p0, p1 = torch.exp2(x0 - mn0), torch.exp2(x1 - mn1)
                p2, p3 = torch.exp2(x2 - mn0), torch.exp2(x3 - mn1)
                l_run[nt, 0] = l_run[nt, 0] * al0 + (p0 + p2)
                l_run[nt, 1] = l_run[nt, 1] * al1 + (p1 + p3)
                o[:, nt] *= torch.stack([al0, al1, al0, al1], dim=1)
                h01 = _round(torch.stack([p0, p1], dim=1), mma_dtype)
                h23 = _round(torch.stack([p2, p3], dim=1), mma_dtype)
                l01 = _round(torch.stack([p0, p1], dim=1) - h01, mma_dtype)
                l23 = _round(torch.stack([p2, p3], dim=1) - h23, mma_dtype)
                p_hi.append(torch.stack([movmatrix_trans(h01), movmatrix_trans(h23)]))
                p_lo.append(torch.stack([movmatrix_trans(l01), movmatrix_trans(l23)]))

            for mt in range(D // 16):
                a = ldmatrix(ring, v_tile + swz(D, (mi >> 1) * 8 + (LANES & 7), 2 * mt + (mi & 1)), 4, True)
                for nt in range(nt_count):
                    o[mt, nt] = mma_m16n8k16(o[mt, nt], a, p_hi[nt])
                    o[mt, nt] = mma_m16n8k16(o[mt, nt], a, p_lo[nt])
        state.wait(0)

        for mask in (4, 8, 16):
            l_run = l_run + l_run[:, :, LANES ^ mask]
        # Combine area: this warp's ring as fp32 [heads][D + 4].
        ring_f = state.ring
        for mt in range(D // 16):
            for nt in range(nt_count):
                for r4 in range(4):
                    h_col = nt * 8 + 2 * _T + (r4 & 1)
                    d_row = mt * 16 + _G + (r4 >> 1) * 8
                    ring_f[4 * (h_col * geom.o_stride + d_row)] = o[mt, nt, :, r4]
        for nt in range(nt_count):
            for c2 in range(2):
                lanes_g0 = _G == 0
                stats_m[warp, nt * 8 + 2 * _T[lanes_g0] + c2] = m_run[nt, c2, lanes_g0]
                stats_l[warp, nt * 8 + 2 * _T[lanes_g0] + c2] = l_run[nt, c2, lanes_g0]

    for h in range(heads):
        hg_i = head_tile * heads + h
        if hg_i >= group:
            continue
        top = float(torch.fmax(stats_m[:, h], torch.tensor(-math.inf)).max())
        total = torch.tensor(0.0)
        acc = torch.zeros(D)
        if top != -math.inf:
            for w in range(warps):
                f = torch.exp2(stats_m[w, h] - top)
                total = total + stats_l[w, h] * f
                acc = acc + warp_states[w].ring[4 * (h * geom.o_stride + torch.arange(D))] * f
        res = acc / total * o_mul if float(total) > 0 else torch.zeros(D)
        head = kv_head * group + hg_i
        if num_splits == 1:
            out[seq, head] = res.to(out.dtype)
            out_writes[seq, head] += 1
        else:
            part_row = (seq * num_heads + head) * num_splits + split
            part_o[part_row] = res
            part_lse[part_row] = top + math.log2(float(total)) if float(total) > 0 else -math.inf
