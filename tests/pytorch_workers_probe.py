"""One worker of tests/test_pytorch_distributed.py's gloo runs on the CPU; prints one JSON line.

    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        python tests/pytorch_workers_probe.py step|lose|alone|gather

step: one DDP step of a tiny model on data of its own rank, then the collectives; lose: rank 1
leaves after joining and rank 0 says what its next collective raised; alone: rank 0 waits for
a rank 1 that never comes; gather: each rank's shard of an
evaluation split, gathered into evaluation order. torch only: this process never loads TensorFlow.
"""

import copy
import json
import os
import sys

from hpcai500_tf.errors import UserError
from hpcai500_tf.pytorch import distributed
from hpcai500_tf.pytorch.build import import_torch

TIMEOUT_S = 30.0


def tiny_model(torch):
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 1)
    )


def data(torch, rank):
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 3, generator=generator)


def loss_of(model, x):
    return model(x).pow(2).mean()


def flat(model) -> list[float]:
    return [float(v) for p in model.parameters() for v in p.detach().reshape(-1)]


def step(torch, workers) -> dict:
    torch.manual_seed(workers.rank)  # different initial weights: DDP broadcasts rank 0's
    device = distributed.init_process_group(torch, workers, torch.device("cpu"), TIMEOUT_S)
    model = distributed.wrap_model(torch, tiny_model(torch), workers, device)
    start = copy.deepcopy(model.module)  # rank 0's weights, broadcast by DDP
    # What averaging the gradients should give: both ranks' gradients, computed here alone.
    expected = copy.deepcopy(start)
    grads = []
    for rank in range(workers.world_size):
        replica = copy.deepcopy(start)
        loss_of(replica, data(torch, rank)).backward()
        grads.append([p.grad.clone() for p in replica.parameters()])
    with torch.no_grad():
        for i, p in enumerate(expected.parameters()):
            p -= 0.1 * sum(g[i] for g in grads) / len(grads)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of(model, data(torch, workers.rank)).backward()
    optimizer.step()
    bn = model.module[1]
    mean_before = bn.running_mean.tolist()
    distributed.average_buffers(torch, workers, model)
    result = {
        "source": workers.source,
        "rank": workers.rank,
        "start": flat(start),
        "params": flat(model.module),
        "expected": flat(expected),
        "mean_before": mean_before,
        "mean_after": bn.running_mean.tolist(),
        "batches_tracked": int(bn.num_batches_tracked),
        "rows": distributed.all_gather_rows(torch, workers, [workers.rank, 10.0 * workers.rank]),
        "same": distributed.same_on_all_workers(torch, workers, "config A"),
        "differ": distributed.same_on_all_workers(torch, workers, f"config {workers.rank}"),
    }
    distributed.barrier(torch, workers)
    distributed.shutdown(torch)
    result["initialised_after_shutdown"] = torch.distributed.is_initialized()
    return result


def lose(torch, workers) -> dict:
    distributed.init_process_group(torch, workers, torch.device("cpu"), 10.0)
    distributed.barrier(torch, workers)
    if workers.rank == 1:
        print(json.dumps({"left": True}), flush=True)
        os._exit(0)  # gone without closing anything
    try:
        distributed.all_gather_rows(torch, workers, [1.0])
    except Exception as error:  # noqa: BLE001 - what it is is the result
        return {"error": type(error).__name__, "peer_lost": distributed.peer_lost(error)}
    return {"error": None}


def alone(torch, workers) -> dict:
    try:
        distributed.init_process_group(torch, workers, torch.device("cpu"), 2.0)
    except UserError as error:
        return {"user_error": str(error)}
    return {"user_error": None}


def gather(torch, workers) -> dict:
    """Each rank's shard of an evaluation split of 51 examples, as `shard(2, rank)` reads
    it (examples rank, rank + 2, ...; 26 and 25 rows), each row [example, example / 10]:
    gathered and put in evaluation order, as an ensemble member's probabilities are."""
    from hpcai500_tf.run import predictions

    distributed.init_process_group(torch, workers, torch.device("cpu"), TIMEOUT_S)
    mine = torch.arange(workers.rank, 51, workers.world_size, dtype=torch.float32)
    rows = torch.stack([mine, mine / 10], dim=1)
    parts = distributed.all_gather_tensors(torch, workers, rows)
    ordered = predictions.in_evaluation_order([part.numpy() for part in parts])
    labels = distributed.all_gather_tensors(torch, workers, mine.to(torch.int64))
    distributed.shutdown(torch)
    return {
        "sizes": [len(part) for part in parts],
        "ordered": ordered.tolist(),
        "labels": predictions.in_evaluation_order([part.numpy() for part in labels]).tolist(),
        "label_dtype": str(labels[0].dtype),
    }


def main() -> None:
    torch = import_torch()
    workers = distributed.workers_from_environment()
    modes = {"step": step, "lose": lose, "alone": alone, "gather": gather}
    result = modes[sys.argv[1]](torch, workers)
    result["tensorflow_loaded"] = "tensorflow" in sys.modules
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # as `train` ends a PyTorch worker (pytorch/train.py end_worker): no teardown


if __name__ == "__main__":
    main()
