"""`torch_cp`'s bytes: PyTorch's ring sends through the functional collectives, which LongCA's
``Comm`` never sees, so the strategy counts them by wrapping the two its ring calls.  (The strategy
itself runs on CUDA only; here the wrappers are checked around stand-in collectives.)"""

from types import SimpleNamespace

import torch
import torch.distributed._functional_collectives as ft_c

from longca.cp.torch_cp import CountedFunctionalCollectives


def test_pytorchs_ring_reaches_the_collectives_through_the_module_the_counter_wraps():
    from torch.distributed.tensor.experimental._context_parallel import _attention

    assert _attention.ft_c is ft_c
    source = open(_attention.__file__).read()
    called = {name for name in dir(ft_c) if f"ft_c.{name}(" in source}
    # Every collective PyTorch's CP module calls is one the counter wraps, a gather and the
    # permutation among them.
    assert "permute_tensor" in called and called & set(CountedFunctionalCollectives.GATHERS)
    assert called <= set(CountedFunctionalCollectives.NAMES), called


def test_each_call_adds_what_this_rank_sends_and_restore_puts_the_originals_back(monkeypatch):
    calls = []
    monkeypatch.setattr(ft_c, "all_gather_single", lambda x, dim, group: calls.append("gather") or x, raising=False)
    monkeypatch.setattr(ft_c, "permute_tensor", lambda x, dsts, group: calls.append("permute") or x)
    before = (ft_c.all_gather_single, ft_c.permute_tensor)
    owner = SimpleNamespace(comm_bytes=0, world=4)
    counter = CountedFunctionalCollectives(owner)
    kv = torch.zeros(2, 8, 16, 64, dtype=torch.bfloat16)          # 32 KiB
    assert ft_c.all_gather_single(kv, 0, None) is kv
    assert owner.comm_bytes == 3 * kv.numel() * 2                 # to each of the 3 other ranks
    ft_c.permute_tensor(kv.float(), [1, 2, 3, 0], None)
    assert owner.comm_bytes == 3 * kv.numel() * 2 + kv.numel() * 4  # float32 dK/dV to one rank
    assert calls == ["gather", "permute"]
    counter.restore()
    assert (ft_c.all_gather_single, ft_c.permute_tensor) == before
    alone = SimpleNamespace(comm_bytes=0, world=1)   # cp_size 1: PyTorch still permutes, to itself
    counter = CountedFunctionalCollectives(alone)
    ft_c.all_gather_single(kv, 0, None)
    ft_c.permute_tensor(kv, [0], None)
    counter.restore()
    assert alone.comm_bytes == 0
