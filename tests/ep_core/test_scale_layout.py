"""ep_core/csrc/scale_layout.h, the rule that turns a dispatch's FP8 scales tensor into what the
kernel indexes with, compiled with g++ on the CPU and fed the sizes and strides torch reports
for every layout a caller may pass: row-major, DeepEP's column-major (`s.T.contiguous().T`), and
their degenerate forms at 0 and 1 tokens (the zero-token bug of issue 9: an empty scales tensor
has no storage, and the binding used to read its null data pointer as "no scales")."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.needs import needs

REPO = Path(__file__).resolve().parents[2]

DRIVER = r"""
#include <cstdio>
#include "ep_core/csrc/scale_layout.h"
int main() {
  long long present, rows, cols, s0, s1, tokens, expected;
  while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &present, &rows, &cols, &s0, &s1, &tokens, &expected) == 7) {
    std::string err;
    ep_core::ScaleLayout l = ep_core::scale_layout(present != 0, rows, cols, s0, s1, tokens, expected, &err);
    std::printf("%d %d %lld %lld %s\n", int(l.present), l.num_scales, (long long)l.token_stride,
                (long long)l.hidden_stride, err.empty() ? "ok" : "error");
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def layout_of(tmp_path_factory):
    gxx = shutil.which("g++")
    needs(gxx is not None, "g++", "apt-get install g++", tool="g++")
    d = tmp_path_factory.mktemp("scale_layout")
    (d / "driver.cpp").write_text(DRIVER)
    res = subprocess.run([gxx, "-std=c++17", "-O1", f"-I{REPO}", str(d / "driver.cpp"), "-o", str(d / "driver")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr

    def run(cases):
        text = "\n".join(" ".join(str(int(v)) for v in c) for c in cases) + "\n"
        out = subprocess.run([str(d / "driver")], input=text, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = []
        for line in out.stdout.splitlines():
            p, n, ts, hs, status = line.split()
            rows.append((bool(int(p)), int(n), int(ts), int(hs), status))
        return rows

    return run


def _case(s: torch.Tensor, tokens: int, present: bool = True):
    return (int(present), s.size(0), s.size(1), s.stride(0), s.stride(1), tokens, s.size(1))


def _read(s: torch.Tensor, layout) -> torch.Tensor:
    """What the kernel reads: x_scales[t * token_stride + i * hidden_stride] from s's storage."""
    _, n, ts, hs, _ = layout
    flat = torch.as_strided(s, (s.numel(),), (1,), s.storage_offset()) if s.numel() else s.reshape(-1)
    out = torch.empty(s.size(0), n)
    for t in range(s.size(0)):
        for i in range(n):
            out[t, i] = flat[t * ts + i * hs]
    return out


@pytest.mark.parametrize("tokens", [0, 1, 2, 37])
@pytest.mark.parametrize("cols", [1, 56])
def test_both_layouts_read_every_scale_at_its_place(layout_of, tokens, cols):
    s = torch.arange(tokens * cols, dtype=torch.float32).view(tokens, cols) + 0.5
    col_major = s.T.contiguous().T
    out = layout_of([_case(s, tokens), _case(col_major, tokens)])
    for t, lay in zip((s, col_major), out):
        present, n, ts, hs, status = lay
        assert status == "ok" and present and n == cols, "an empty scales tensor is still FP8 with its columns"
        assert ts >= 0 and hs >= 1
        if tokens:
            assert torch.equal(_read(t, lay), s)


def test_empty_scales_are_fp8_whatever_their_strides(layout_of):
    # torch's strides of the zero-token cases: both layouts report (56, 1) here, but nothing
    # about an empty tensor's strides (or its null data pointer) may decide FP8-ness or num_scales
    for strides in ((56, 1), (1, 1), (1, 0), (0, 0)):
        (present, n, ts, hs, status), = layout_of([(1, 0, 56, *strides, 0, 56)])
        assert (present, n, status) == (True, 56, "ok")
        assert (ts, hs) == (56, 1), "no element is read: row-major strides" 


def test_no_scales_and_wrong_shapes(layout_of):
    absent, wrong_rows, wrong_cols, negative = layout_of([
        (0, 0, 0, 0, 0, 5, 56), (1, 4, 56, 56, 1, 5, 56), (1, 5, 55, 55, 1, 5, 56), (1, 5, 56, -56, 1, 5, 56)])
    assert absent == (False, 0, 0, 0, "ok")
    assert wrong_rows[-1] == wrong_cols[-1] == negative[-1] == "error"
