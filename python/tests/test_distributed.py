"""Vocabulary-parallel cross-entropy over torch.distributed: two processes
(gloo on the CPU; also NCCL where two GPUs and CUDA kernels exist) each
hold part of the columns; the loss and the gradient equal the unsharded
call. Skipped without torch."""
import datetime
import os

import numpy as np
import pytest

try:
    import torch
except ImportError as e:        # not installed, or an install that is broken
    pytest.skip("PyTorch is not importable (%s): the torch.distributed "
                "test is skipped (pip install torch to run it)" % e,
                allow_module_level=True)
if not hasattr(torch, "distributed") or not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import xent  # noqa: E402
from util import ulp  # noqa: E402

T, V, WORLD = 33, 1001, 2
BOUNDS = [0, 420, V]        # uneven shards: rank r holds [b_r, b_{r+1})
OPTS = [dict(), dict(reduction="sum", label_smoothing=0.1, z_loss=1e-3),
        dict(reduction="none", temperature=0.7, softcap=8.0)]


def inputs(seed):
    g = np.random.default_rng(seed)
    z = torch.from_numpy(g.standard_normal((T, V)) * 3).float()
    y = torch.from_numpy(g.integers(0, V, size=T))
    y[::7] = -100
    return z, y


def _worker(rank, backend, init, seed, outdir):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # loopback only
    dist.init_process_group(backend, init_method=init, rank=rank,
                            world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cuda", rank) if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(dev)
    z, y = inputs(seed)
    z, y = z.to(dev), y.to(dev)
    lo, hi = BOUNDS[rank], BOUNDS[rank + 1]
    for k, o in enumerate(OPTS):
        x = z[:, lo:hi].clone().requires_grad_(True)
        loss = xent.cross_entropy(x, y, process_group=dist.group.WORLD,
                                  vocab_start=lo, **o)
        w = torch.linspace(0.5, 1.5, loss.numel(), device=dev) \
            .reshape(loss.shape)
        (loss * w).sum().backward()
        torch.save({"loss": loss.detach().cpu(), "grad": x.grad.cpu()},
                   os.path.join(outdir, "r%d_%d.pt" % (rank, k)))
    dist.barrier()
    dist.destroy_process_group()


BACKENDS = ["gloo"]
if torch.cuda.is_available() and torch.cuda.device_count() >= WORLD \
        and xent.cuda_available() and dist.is_nccl_available():
    BACKENDS.append("nccl")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_equals_unsharded(tmp_path, backend):
    """gloo: CPU tensors; nccl (2 GPUs): CUDA tensors on cuda:0 / cuda:1,
    compared with the unsharded call on cuda:0."""
    seed = int(np.random.default_rng().integers(1 << 30))
    init = "file://" + str(tmp_path / "rendezvous")
    mp.spawn(_worker, args=(backend, init, seed, str(tmp_path)),
             nprocs=WORLD, join=True)
    z, y = inputs(seed)
    if backend == "nccl":
        z, y = z.cuda(), y.cuda()
    for k, o in enumerate(OPTS):
        x = z.clone().requires_grad_(True)
        loss = xent.cross_entropy(x, y, **o)
        w = torch.linspace(0.5, 1.5, loss.numel(), device=z.device) \
            .reshape(loss.shape)
        (loss * w).sum().backward()
        parts = [torch.load(str(tmp_path / ("r%d_%d.pt" % (r, k))))
                 for r in range(WORLD)]
        want_l = loss.detach().double().cpu().numpy()
        want_g = x.grad.double().cpu().numpy()
        # Both are faithful roundings of the same exact value (the shard
        # combine is exact up to double rounding): within 1 ulp of each other.
        for r in range(WORLD):
            got_l = parts[r]["loss"].double().numpy()
            assert np.all(np.abs(got_l - want_l) <= ulp(want_l)), (o, r)
        got_g = torch.cat([p["grad"] for p in parts], dim=1).double().numpy()
        assert got_g.shape == want_g.shape
        assert np.all(np.abs(got_g - want_g) <= ulp(want_g)), o
