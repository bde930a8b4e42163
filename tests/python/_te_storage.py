"""TransformerEngine's grouped storage, built here as TE builds it (TE cannot be imported in CI: its
torch package builds from source against CUDA), and read back as TE's kernels read it. Written from
TE's sources (NVIDIA/TransformerEngine at d0067d0), not from pagestash's layouts, so that the tests
check pagestash's inference against an independent statement of TE's layout:

- buffers: flat `torch.uint8` (`Quantizer::create_grouped_tensor` in
  transformer_engine/pytorch/csrc/quantizer.cpp; BF16: flat of its dtype, `make_grouped_tensor` in
  transformer_engine/pytorch/tensor/storage/grouped_tensor_storage.py), `tokens` = the logical first
  dimension; columnwise scales sized `get_scale_shape([tokens, hidden], columnwise=True)`
  (mxfp8_tensor.py: `[ru(M // 32, 4), ru(K, 128)]`; nvfp4_tensor.py: `[ru(K, 128), ru(ceil(M / 16), 4)]`);
  NVFP4's columnwise amax `[groups]` float32;
- one group (TE quantizes the whole `[tokens, hidden]` tensor): MXFP8 columnwise data `[tokens, hidden]`,
  NVFP4's transposed `[hidden, tokens / 2]` (PR 2691), scales one matrix;
- several groups (the graph-safe grouped kernels: graph_safe_group_row_cast_col_hadamard_transform_
  cast_fusion.cu writes group g's columnwise data at `offsets[g] / 2` as `(hidden, m_g)` and its
  scales at `offsets[g] / 16`, offsets[g] = sum of m_h * hidden before it): each group's block after
  the last;
- swizzled scales: cuBLAS's 128x4 tiles of 512 bytes, the columnwise matrix with hidden as its rows;
- marks: `mark_grouped_tensor` (transformer_engine/pytorch/utils.py): `grouped_tensor_scale_inv` False
  on the data, True on the columnwise scales."""

from dataclasses import dataclass, field
from typing import List

import torch

MARKER = "grouped_tensor_scale_inv"
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def ru(x, m):
    return (x + m - 1) // m * m


def cdiv(x, m):
    return (x + m - 1) // m


def swizzled(r, c, cols):
    """Byte offset of entry (r, c) of a [rows, cols] scale matrix stored in cuBLAS's 128x4 tiles."""
    tile = (r // 128) * (cols // 4) + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def mark_grouped_tensor(data, scales=None):
    """As TE's mark_grouped_tensor: False on a plain tensor or a quantized tensor's columnwise data, True
    on its columnwise scales."""
    setattr(data, MARKER, False)
    if scales is not None:
        setattr(scales, MARKER, True)


@dataclass
class Storage:
    """One TE grouped tensor's columnwise storage (what its backward saves): `fmt` 'bf16', 'mxfp8'
    or 'nvfp4', `groups` TE groups, `counts` their live tokens (host ints), `swizzled` scales."""
    fmt: str
    tokens: int
    hidden: int
    counts: List[int]
    groups: int
    swizzled: bool = True
    data: torch.Tensor = None
    scales: torch.Tensor = None
    amax: torch.Tensor = None
    starts: List[int] = field(default_factory=list)

    def __post_init__(self):
        self.starts = [sum(self.counts[:g]) for g in range(len(self.counts))]
        assert sum(self.counts) <= self.tokens

    @property
    def kp(self):
        return ru(self.hidden, 128)

    def saved(self):
        """What its backward saves, in TE's prepare_for_saving order (columnwise data, columnwise
        scales, columnwise amax)."""
        return [t for t in (self.data, self.scales, self.amax) if t is not None]

    # -- where TE's kernels read token l of group g at hidden k (index tensors) ----------------------

    def _group(self, g):
        return (torch.tensor(self.starts, dtype=torch.long)[g], torch.tensor(self.counts, dtype=torch.long)[g])

    def data_index(self, g, l, k):
        """(byte, nibble) of each element (token l of group g, hidden k) in the data buffer, in elements
        of the data's dtype for BF16 (nibble None: whole bytes)."""
        K, T = self.hidden, self.tokens
        start, m = self._group(g)
        if self.fmt in ("bf16", "mxfp8"):  # [tokens, hidden] rows; groups after one another
            return (start + l) * K + k, None
        if self.groups == 1:  # NVFP4, the whole tensor transposed: [K, T / 2]
            return k * (T // 2) + l // 2, l % 2
        return start * K // 2 + k * (m // 2) + l // 2, l % 2  # NVFP4 group by group: [K, m_g / 2]

    def scale_index(self, g, l, k):
        """Byte of the scale of each element (token l of group g, hidden k)."""
        start, m = self._group(g)
        if self.fmt == "mxfp8":
            b = l // 32
            if self.groups == 1:
                rows = ru(self.tokens // 32, 4)
                return swizzled(k, b, rows) if self.swizzled else b * self.kp + k
            base = start // 32 * self.kp
            return base + (swizzled(k, b, m // 32) if self.swizzled else b * self.kp + k)
        j = l // 16
        if self.groups == 1:
            cols = ru(cdiv(self.tokens, 16), 4)
            return swizzled(k, j, cols) if self.swizzled else k * cols + j
        base = start * self.kp // 16
        return base + (swizzled(k, j, m // 16) if self.swizzled else k * (m // 16) + j)

    def live(self):
        """(group, token in group, hidden) index tensors of every live element."""
        gs, ls, ks = [], [], []
        for g, m in enumerate(self.counts):
            l, k = torch.meshgrid(torch.arange(m), torch.arange(self.hidden), indexing="ij")
            gs.append(torch.full((m * self.hidden,), g))
            ls.append(l.reshape(-1))
            ks.append(k.reshape(-1))
        return torch.cat(gs), torch.cat(ls), torch.cat(ks)

    def rows(self, g, l):
        return self._group(g)[0] + l

    def live_bytes(self):
        """Boolean masks over the data and scale bytes that a reading of the live tokens touches."""
        es = self.data.element_size()
        data = torch.zeros(self.data.numel() * es, dtype=torch.bool)
        g, l, k = self.live()
        byte, _ = self.data_index(g, l, k)
        for i in range(es):
            data[byte * es + i] = True
        if self.scales is None:
            return data, None
        scales = torch.zeros(self.scales.numel(), dtype=torch.bool)
        scales[self.scale_index(g, l, k)] = True
        return data, scales

    def read(self, data=None, scales=None):
        """[tokens, hidden] float32: the live elements dequantized from the buffers (TE's bytes where its
        kernels read them; the dead rows 0). NVFP4's tensor scale (amax) is left out: TE keeps it."""
        data = self.data if data is None else data
        scales = self.scales if scales is None else scales
        g, l, k = self.live()
        out = torch.zeros(self.tokens, self.hidden)
        byte, nibble = self.data_index(g, l, k)
        rows = self.rows(g, l)
        if self.fmt == "bf16":
            out[rows, k] = data.view(-1)[byte].float()
            return out
        raw = data.view(torch.uint8).view(-1)[byte]
        s = scales.view(torch.uint8).view(-1)[self.scale_index(g, l, k)]
        if self.fmt == "mxfp8":
            value = raw.view(torch.float8_e4m3fn).float() * torch.exp2(s.float() - 127)
        else:
            code = torch.where(nibble == 0, raw & 0xF, raw >> 4)
            value = E2M1[code.long()] * s.view(torch.float8_e4m3fn).float()
        out[rows, k] = value
        return out


def make(fmt, tokens, hidden, counts, groups=None, swizzled=True, x=None, seed=0):
    """TE's grouped storage of `fmt` for `counts` (host ints), its live elements from `x` ([tokens, hidden],
    rows packed group after group; random when None), the rest as torch.empty leaves it (random bytes
    here, NaN codes included), marked as mark_grouped_tensor marks it."""
    groups = len(counts) if groups is None else groups
    st = Storage(fmt, tokens, hidden, list(counts), groups, swizzled)
    gen = torch.Generator().manual_seed(seed)
    if x is None:
        x = torch.randn(tokens, hidden, generator=gen)
    x = x.detach().float()
    K, T = hidden, tokens
    if fmt == "bf16":
        st.data = torch.randn(T * K, generator=gen).to(torch.bfloat16)  # the dead rows: anything
        st.data.view(T, K)[:sum(counts)] = x[:sum(counts)].to(torch.bfloat16)
        mark_grouped_tensor(st.data)
        return st
    nbytes = T * K if fmt == "mxfp8" else T * K // 2
    sbytes = ru(T // 32, 4) * ru(K, 128) if fmt == "mxfp8" else ru(K, 128) * ru(cdiv(T, 16), 4)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 256, (sbytes,), dtype=torch.uint8, generator=gen)
    g, l, k = st.live()
    v = x[st.rows(g, l), k]
    byte, nibble = st.data_index(g, l, k)
    sb = st.scale_index(g, l, k)
    if fmt == "mxfp8":
        s = 120 + (l // 32 + k) % 15  # E8M0 2^-7 .. 2^7, one a block
        scales[sb] = s.to(torch.uint8)
        data[byte] = (v / torch.exp2(s.float() - 127)).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        scales[sb] = (0.5 + (l // 16 + k) % 7 * 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
        code = ((v.abs() * 4).long() % 7 + 1) | torch.where(v < 0, 8, 0)  # a non-zero E2M1 code from x
        even, odd = nibble == 0, nibble == 1
        data[byte[even]] = (data[byte[even]] & 0xF0) | code[even].to(torch.uint8)
        data[byte[odd]] = (data[byte[odd]] & 0x0F) | (code[odd].to(torch.uint8) << 4)
    st.data, st.scales = data, scales
    if fmt == "nvfp4":
        st.amax = torch.rand(groups, generator=gen) + 1  # TE's columnwise amax: kept by TE, not marked
    mark_grouped_tensor(st.data, st.scales)
    return st
