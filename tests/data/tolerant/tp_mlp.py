"""An MLP (LayerNorm, Linear, GELU, Linear) trained for three SGD steps on the CPU, seeded, with
tensor parallelism when started on several ranks: the TP=2-against-TP=1 pair of issue 30.

    tp_mlp.py                                                   # TP=1: one process, no group
    torchrun --standalone --nproc-per-node 2 tp_mlp.py          # TP=2 over gloo (DTensor)
    torchrun --standalone --nproc-per-node 2 tp_mlp.py --bug    # TP=2, a sharding bug

On several ranks the model is split with ``parallelize_module``: ``fc1`` column-wise, ``fc2``
row-wise (its output all-reduced), the norm replicated. Every run builds the same full model
from one seed and then loads the same full checkpoint into it, each rank copying its own shard
(the offset from the parameter's DTensor placement), so TP=1 and TP=2 start from equal logical
weights and read the same data; they differ only by the order of the sums (within rounding).
``--bug`` loads ``fc2.weight`` from the wrong offset (every rank takes the first shard): a
real change on rank 1 from the load on.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

IN, HIDDEN, OUT, BATCH, STEPS = 64, 256, 16, 32, 3


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(IN)
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def parallelize(model: MLP, world: int) -> None:
    """fc1 column-wise, fc2 row-wise over a mesh of every rank (gloo)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def load(model: MLP, checkpoint: dict[str, torch.Tensor], bug: bool) -> None:
    """Each parameter's local shard copied from the full checkpoint tensor."""
    from torch.distributed.tensor import DTensor, Shard

    with torch.no_grad():
        for name, param in model.named_parameters():
            full, local = checkpoint[name], param
            if isinstance(param, DTensor):
                local = param.to_local()
                for placement, rank in zip(
                    param.placements, param.device_mesh.get_coordinate() or (), strict=True
                ):
                    if isinstance(placement, Shard):
                        size = local.shape[placement.dim]
                        offset = 0 if bug and name == "fc2.weight" else rank * size  # <- bug
                        full = full.narrow(placement.dim, offset, size)
            local.copy_(full)  # <- load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", action="store_true", help="load fc2.weight from a wrong offset")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    checkpoint = {name: p.detach().clone() for name, p in MLP().named_parameters()}
    model = MLP()
    if world > 1:
        parallelize(model, world)
    load(model, checkpoint, args.bug)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(STEPS, BATCH, IN)
    target = torch.randn(STEPS, BATCH, OUT)
    for step in range(STEPS):
        loss = F.mse_loss(model(data[step]), target[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
