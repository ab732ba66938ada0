"""The stop vote rides on a reduction the step does anyway (#38): TensorFlow's loss all-reduce,
PyTorch's first DDP gradient bucket. The votes come back summed over every replica, the step's
results do not change, no collective is added, and the workers read the votes two steps back.

Each check runs in a fresh Python process (logical CPU devices must be set before TensorFlow
starts; gloo needs processes of its own) and prints its findings as one JSON line.
"""

import json
import signal
import subprocess
import sys

import pytest

from hpcai500_tf.run import stop

TENSORFLOW = """
import json, signal
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from hpcai500_tf import config
from hpcai500_tf.engine.run import build_engine
from hpcai500_tf.run import stop

engine = build_engine(config.prepare("image_classification", "tiny",
                                     ["training.strategy=mirrored"]), None)
batch = next(engine.train_batches())
variables = [*engine.model.variables, *engine.optimizer.variables]
saved = [tf.identity(v) for v in variables]
plain = float(engine.train_step(batch))
for variable, value in zip(variables, saved):
    variable.assign(value)
carried = float(engine.train_step(batch, int(signal.SIGTERM)))
facts = {"plain": plain, "carried": carried, "first": engine.votes.agreed()}
engine.train_step(batch, 0)
facts["agreed"] = engine.votes.agreed()  # the vote of the step before last
facts["summed"] = engine.votes.read(engine.votes.pending[0])
engine.train_step(batch, 0)
facts["after"] = engine.votes.agreed()


def op_types(votes):
    args = (*batch, votes) if votes is None else (*batch, tf.constant(votes))
    graph = engine.traced_train_step.get_concrete_function(*args).graph
    return [op.type for op in graph.get_operations()]


facts["ops_plain"], facts["ops_carried"] = op_types(None), op_types(stop.vote(0))
print(json.dumps(facts))
"""

PYTORCH = """
import copy, json, os, sys
import torch
import torch.distributed as dist
from hpcai500_tf.pytorch import stop_vote

rank = int(sys.argv[1])
dist.init_process_group("gloo", rank=rank, world_size=2)
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])  # several buckets
voting = stop_vote.voting_model(torch, copy.deepcopy(net), "cpu")
models = [torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.01) for m in (net, voting)]
ballot = stop_vote.Ballot(torch, voting.ballot, 2)
x = torch.full((4, 64), float(rank + 1))
losses, grads = [], []
for i, model in enumerate(models):
    model.zero_grad()
    loss = model(x).pow(2).sum()
    losses.append(loss.item())
    (loss + ballot.term(15 if rank else 0) if i else loss).backward()
    network = model.module.network if i else model.module
    grads.append([p.grad.clone() for p in network.parameters()])
facts = {"equal": all(torch.equal(a, b) for a, b in zip(*grads)) and losses[0] == losses[1],
         "summed": ballot.summed().tolist(), "ballot": voting.ballot.tolist()}
voting.network.zero_grad()
(models[1](x).sum() + ballot.term(0)).backward()  # the next step: no signal, no stale vote
facts["next"] = ballot.summed().tolist()
if rank == 0:
    print(json.dumps(facts), flush=True)
dist.destroy_process_group()
os._exit(0)  # as pytorch/train.end_worker: gloo's teardown at exit sometimes aborts (SIGABRT)
"""


def _facts(script: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pending_votes_read_the_step_before_last():
    votes = stop.PendingVotes(read=list)
    assert votes.agreed() == 0
    votes.push(stop.vote(signal.SIGUSR1))
    assert votes.agreed() == 0  # one step run: nothing read yet
    votes.push(stop.vote(0))
    assert votes.agreed() == signal.SIGUSR1  # two steps back
    votes.push(stop.vote(0))
    assert votes.agreed() == 0
    votes.clear()
    assert votes.agreed() == 0


def test_tensorflow_carries_the_vote_in_the_loss_reduction():
    """Two replicas: the step carrying a vote gives the plain step's loss, its votes come
    back summed over the replicas two steps later, and its graph adds no reduction."""
    facts = _facts(TENSORFLOW)
    assert facts["carried"] == pytest.approx(facts["plain"], rel=1e-6)  # two graphs, any CPU
    assert facts["first"] == 0
    assert facts["agreed"] == signal.SIGTERM
    assert facts["summed"] == [0.0, 0.0, 2.0]  # SIGTERM's place, once per replica
    assert facts["after"] == 0
    plain, carried = facts["ops_plain"], facts["ops_carried"]
    reductions = ("AddN", "CollectiveReduceV2", "NcclAllReduce", "_HostCast")
    for op in reductions:
        assert plain.count(op) == carried.count(op), op
    added = set(carried) - set(plain)
    assert added <= {"ConcatV2", "Reshape", "StridedSlice", "Cast", "Const"}, added


def test_pytorch_carries_the_vote_in_the_gradient_all_reduce(torch_installed, tmp_path):
    """Two gloo workers, a model in several DDP buckets: with the ballot the loss and the
    gradients equal DDP's own bit for bit, the votes come back summed, the ballot stays zero,
    and the next step's vote replaces the last one's."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", PYTORCH, str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [w.communicate(timeout=300) for w in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
    facts = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert facts["equal"]
    assert facts["summed"] == [0.0, 0.0, 1.0]  # SIGTERM (15) from rank 1 only
    assert facts["ballot"] == [0.0, 0.0, 0.0]
    assert facts["next"] == [0.0, 0.0, 0.0]
