"""Stand-in libraries for the kernel adapters' CPU tests: a module path put into ``sys.modules`` (for
the test only, through ``monkeypatch``) with the names an adapter looks up, each following the real
library's documented semantics in plain torch (the tests that use them say how)."""

import sys
import types

import torch

from longca import kernels
from longca.attention import reference
from longca.attention.problem import Problem
from longca.spec import ProblemSpec


def install_library(monkeypatch, dotted: str, **names) -> types.ModuleType:
    """``dotted`` (e.g. ``magi_attention.functional``) and each package above it as empty modules
    linked to their children; ``names`` set on the innermost one, which is returned."""
    parts = dotted.split(".")
    parent = None
    for depth in range(1, len(parts) + 1):
        module = types.ModuleType(".".join(parts[:depth]))
        monkeypatch.setitem(sys.modules, module.__name__, module)
        if parent is not None:
            setattr(parent, parts[depth - 1], module)
        parent = module
    for name, value in names.items():
        setattr(parent, name, value)
    return parent


def fresh_adapter(kernel: str):
    """A new instance of a registered kernel's adapter, which finds the stand-in (the registered one
    may have cached "missing" from an earlier test)."""
    adapter = type(kernels.get(kernel))()
    assert adapter.available() is None, adapter.available()
    return adapter


def head_block_problem(block: int, variable_unit: int | None = None, **over):
    """A small per-head block pattern for an adapter's stand-in test: 512 tokens, float64, 4 query
    heads over 2 KV heads, tiles of ``block`` tokens, or with ``variable_unit`` tiles of random sizes
    in such units averaging ``block`` (``over`` replaces any other setting)."""
    params = {"kept": 0.3, "block": block, "heads": 2, "group": 2}
    pattern = "block_sparse_heads"
    if variable_unit:
        pattern, params["unit"] = "variable_block_sparse_heads", variable_unit
    spec = dict(mask="sparse", pattern=pattern, seqlen=512, dtype="float64", batch=1, heads_q=4, heads_kv=2,
                head_dim=8, mask_params=params)
    return Problem.from_spec(ProblemSpec(**{**spec, **over}))


def assert_matches_reference(out, q, k, v, grad_out, mask, backward: bool = True) -> None:
    """A stand-in's output, and with ``backward`` its gradients, equal the float64 reference's on
    ``mask`` (the stand-ins compute in float64: only summation order differs)."""
    ref = reference.attention(q, k, v, mask)
    assert torch.allclose(out, ref, atol=1e-10)
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
        assert all(torch.allclose(g, r, atol=1e-9) for g, r in zip(grads, ref_grads))
