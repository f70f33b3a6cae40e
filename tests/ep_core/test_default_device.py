"""ep_core behaves the same whatever default device and dtype the caller set (issue 35): DeepEP's
test utilities, and many training scripts, call `torch.set_default_device('cuda')` and
`torch.set_default_dtype(torch.bfloat16)`; a torch factory call that names no device then
allocates on the GPU (a pinned host buffer became `RuntimeError: Only dense CPU tensors can be
pinned`), and one that names no dtype draws bf16 random numbers instead of float32.

Two guards: every factory call in ep_core's source names both `device=` and `dtype=` (an AST
scan), and the host paths of both Buffers, run over the CPU fakes, make no factory call from
ep_core without them (a TorchFunctionMode watching the calls: the mechanism set_default_device
itself uses)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

EP_CORE = Path(__file__).resolve().parents[2] / "ep_core"

# torch's factory functions that torch.set_default_device redirects (torch.utils._device's list
# in torch 2.13); the test below checks that torch adds none this list lacks.
FACTORIES = frozenset({
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty", "empty_permuted",
    "empty_quantized", "empty_strided", "eye", "fft_fftfreq", "fft_rfftfreq", "full", "hamming_window",
    "hann_window", "kaiser_window", "linspace", "logspace", "nested_tensor", "ones", "rand", "randint", "randn",
    "randperm", "range", "scalar_tensor", "sparse_bsc_tensor", "sparse_bsr_tensor", "sparse_compressed_tensor",
    "sparse_coo_tensor", "sparse_csc_tensor", "sparse_csr_tensor", "tensor", "tril_indices", "triu_indices", "zeros",
})
NEEDED = ("device", "dtype")


def test_the_factory_list_covers_torchs():
    from torch.utils import _device

    names = {getattr(f, "__name__", str(f)) for f in _device._device_constructors()}
    assert names <= FACTORIES, f"torch redirects factories this test does not check: {sorted(names - FACTORIES)}"


def _splat_keys(func: ast.AST, name: str) -> set[str]:
    """Keys of `name = dict(k=...)` / `name = {"k": ...}` assigned in `func` (a `**name` argument)."""
    keys: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            v = node.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict":
                keys |= {k.arg for k in v.keywords if k.arg}
            elif isinstance(v, ast.Dict):
                keys |= {k.value for k in v.keys if isinstance(k, ast.Constant)}
    return keys


def _factory_calls(path: Path):
    """(line, factory name, keywords it passes) of every `torch.<factory>(...)` call in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]:
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                    and node.func.attr in FACTORIES):
                continue
            keys = {k.arg for k in node.keywords if k.arg}
            for k in node.keywords:
                if k.arg is None and isinstance(k.value, ast.Name):
                    keys |= _splat_keys(func, k.value.id)
            yield node.lineno, node.func.attr, keys


def test_every_factory_call_in_ep_core_names_device_and_dtype():
    missing, seen = [], set()
    for path in sorted(EP_CORE.rglob("*.py")):
        for line, name, keys in _factory_calls(path):
            where = f"{path.relative_to(EP_CORE.parent)}:{line} torch.{name}"
            if where in seen:  # a call inside a function is walked from the module too
                continue
            seen.add(where)
            lacks = [k for k in NEEDED if k not in keys]
            if lacks:
                missing.append(f"{where} lacks {', '.join(lacks)}=")
    assert len(seen) > 40, "the scan found too few factory calls: is it reading ep_core?"
    assert not missing, "factory calls that follow the caller's default device / dtype:\n" + "\n".join(missing)


def test_the_scan_catches_a_call_without_device(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\ndef g(n):\n    i32 = dict(dtype=torch.int32, device='cpu')\n"
                 "    a = torch.empty(n, **i32)\n    return torch.empty(n, dtype=torch.int32, pin_memory=True), a\n")
    got = sorted((line, name, tuple(sorted(keys))) for line, name, keys in _factory_calls(f))
    assert got[0] == (4, "empty", ("device", "dtype")) and got[-1] == (5, "empty", ("dtype", "pin_memory"))


class _FactorySpy(TorchFunctionMode):
    """Records every factory call made from an ep_core file without device= or dtype=."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in FACTORIES and func is getattr(torch, name, None):
            caller = sys._getframe(1)
            if Path(caller.f_code.co_filename).resolve().is_relative_to(EP_CORE):
                lacks = [k for k in NEEDED if kwargs.get(k) is None]
                if lacks:
                    self.found.append(f"{caller.f_code.co_filename}:{caller.f_lineno} torch.{func.__name__} "
                                      f"lacks {', '.join(lacks)}=")
        return func(*args, **kwargs)


def test_the_normal_path_names_device_and_dtype_at_run_time(monkeypatch):
    from ep_core.config import Problem
    from tests.ep_core.fake_ext import fresh_dispatch, one_rank_dispatch

    buf, _, ins, idx, layout = one_rank_dispatch(Problem(64, 256, 4, 16, 1), 5, monkeypatch)
    with _FactorySpy() as spy:
        recv, _, recv_w, _, handle, _ = fresh_dispatch(buf, ins, idx, layout)
        buf.dispatch(ins.x, handle=handle)
        buf.combine(recv, handle, topk_weights=recv_w)
        fresh_dispatch(buf, ins, idx, layout, return_recv_hook=True)[-1]()
    assert not spy.found, "\n".join(spy.found)


def test_the_low_latency_path_names_device_and_dtype_at_run_time(monkeypatch):
    from ep_core import buffer as buffer_mod
    from tests.ep_core.ll_fake import make_low_latency

    monkeypatch.setattr(buffer_mod, "current_raw_stream", lambda device_index: 77)
    obj = make_low_latency(world=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((5, 256), generator=g, dtype=torch.float32).to(torch.bfloat16)
    idx = torch.topk(torch.rand((5, 8), generator=g, dtype=torch.float32), 2, dim=1).indices
    w = torch.rand((5, 2), generator=g, dtype=torch.float32)
    with _FactorySpy() as spy:
        for use_fp8 in (True, False):
            handle = obj.dispatch(x, idx, 8, 8, use_fp8=use_fp8)[2]
            obj.next_combine_buffer(handle)
            obj.combine(torch.zeros((8, 8, 256), dtype=torch.bfloat16), idx, w, handle)
    assert not spy.found, "\n".join(spy.found)


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_routing_is_the_same_under_a_bf16_default_dtype(kind):
    from ep_core.routing import make_routing

    want = make_routing(kind, 64, 32, 4, 2, seed=3, drop=0.2)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):  # a default device that cannot hold data: a call that follows it fails
            got = make_routing(kind, 64, 32, 4, 2, seed=3, drop=0.2)
    finally:
        torch.set_default_dtype(before)
    assert got[0].device.type == got[1].device.type == "cpu", "routing followed the default device"
    assert got[1].dtype == torch.float32
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
