"""The PyTorch backend: trains a benchmark preset in plain PyTorch as the lifecycle's
`Trainer` (run/trainer.py), so that the run, its log, checkpoints, resume, power,
TensorBoard and record are the TensorFlow side's own and only the framework layer (L5) differs.

    hpcai500-tf train image_classification --framework pytorch [--preset smoke] [--set K=V]
        [--data DIR] [--resume RUN_DIR] [--workers N] [--device auto] [--profile-steps A-B]

What is shared with the TensorFlow side, so that only the framework differs:
- the config (presets, `--set`) and everything derived from it: hyperparameters, schedule,
  target, epochs, seed;
- the input pipeline: the same tf.data datasets (procedural gratings, or the ImageNet
  TFRecord shards with the reference preprocessing), handed to PyTorch as arrays;
- the model's architecture (ResNet-50 v1.5, pytorch/resnet.py, defined here because
  torchvision cannot import beside the CPU torch wheel), the loss and quality metric the
  workload names (its `objective`, cross-entropy with label smoothing, and top-1 accuracy),
  SGD with momentum and coupled weight decay, the schedule (run/schedule.py);
- time accounting (initialisation, tracing and a warm-up step whose effect is undone come
  before run_start), power sampling, the record schema and the MLPerf log;
- an ensemble member's bootstrap sample (the feeder builds the member's workload from its
  config) and its evaluation probabilities, saved in the same file (run/predictions.py).

What differs: the framework and its kernels. FLOPs are counted with
torch.utils.flop_counter.FlopCounterMode over one train step (forward and backward) at the
batch that runs. Momentum follows PyTorch's form (buffer = m x buffer + g; w -= lr x buffer),
which is TF1's (`optimizer.momentum_form = "tf1"`, the reference's); a config asking for
Keras's form, Keras's "same" padding of strided convolutions (the model pads them
symmetrically, as the reference does) or a fixed float16 loss scale is refused. Several
workers train through torch.distributed with DistributedDataParallel (pytorch/distributed.py:
started by `--workers N`, torchrun or srun), one device each; SGD only (LARS is refused).
"""

from __future__ import annotations

import copy
import math
import os
import sys
from pathlib import Path

from hpcai500_tf.cluster.workers import JoinWatchdog
from hpcai500_tf.config import Setup, precision_policy_on
from hpcai500_tf.errors import UserError, first_line
from hpcai500_tf.pytorch import build, distributed, stop_vote
from hpcai500_tf.pytorch.build import (
    check_mixed_precision,
    choose_device,
    import_torch,
    nvidia_gpus_present,
)
from hpcai500_tf.pytorch.feeder import Feeder, FeederDataError, FeederError
from hpcai500_tf.run import predictions, stop
from hpcai500_tf.run.lifecycle import run as run_lifecycle
from hpcai500_tf.run.options import RunOptions
from hpcai500_tf.run.progress import fingerprint
from hpcai500_tf.run.schedule import warmup_decay
from hpcai500_tf.run.trainer import (
    Failure,
    StepTrace,
    Trainer,
    checkpoint_damaged,
    checkpoint_unrestorable,
    checkpoint_unwritable,
    flops_block,
    full_batch_steps,
    refuse_disagreeing_workers,
    refuse_unshardable_config,
    refuse_unshardable_evaluation,
)

# Where float16 losses are scaled dynamically: the TensorFlow side's start (Keras's
# LossScaleOptimizer), so that L8's initial_loss_scale is one value for both frameworks
# (GradScaler's own default is 2**16; both double after 2000 finite steps, halve on overflow).
INITIAL_LOSS_SCALE = 2.0**15


def loss_function(torch, objective: str, label_smoothing: float):
    """The workload's training loss (its `objective`) as a torch loss of (logits, labels)."""
    if objective == "softmax_cross_entropy":
        return torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    raise UserError(f"the PyTorch runner has no '{objective}' loss")


def correct_count(quality_metric: str):
    """The workload's quality metric as the examples of a batch it counts right, of
    (logits, labels): the quality is their share of every evaluated example."""
    if quality_metric == "top1_accuracy":
        return lambda logits, labels: int((logits.argmax(1) == labels).sum())
    raise UserError(f"the PyTorch runner has no '{quality_metric}' quality metric")


def refuse_other_forms(setup, on_cuda: bool) -> None:
    """One line for a form this runner does not train (see the module's docstring): Keras's
    momentum, Keras's "same" padding of strided convolutions, a fixed float16 loss scale,
    XLA (which L7 would otherwise record as on)."""
    o = setup.optimizer
    if setup.training.xla:
        raise UserError(
            "the PyTorch runner does not compile with XLA (training.xla = false, not true)"
        )
    padding = setup.config["model"].get("stride_padding", "same")  # older configs: "same"
    if o.momentum_form != "tf1":
        raise UserError(
            "the PyTorch runner's SGD has TF1's momentum form only "
            f"(optimizer.momentum_form = 'tf1', not '{o.momentum_form}')"
        )
    if padding != "symmetric":
        raise UserError(
            "the PyTorch model pads strided convolutions symmetrically only "
            f"(model.stride_padding = 'symmetric', not '{padding}')"
        )
    float16 = precision_policy_on(setup.training.precision, on_cuda) == "mixed_float16"
    if float16 and o.loss_scaling != "dynamic":
        raise UserError(
            "the PyTorch runner scales float16 losses dynamically only "
            f"(optimizer.loss_scaling = 'dynamic', not '{o.loss_scaling}')"
        )


def probabilities(torch, logits):
    """The class probabilities of a batch's logits as the TensorFlow workload saves them: the
    softmax of the logits cast to float32, computed in float32 whatever the autocast."""
    with torch.autocast(logits.device.type, enabled=False):
        return torch.softmax(logits.float(), dim=1)


def initialise_logits(torch, fc, initializer: str) -> None:
    """The logits layer's weights as the TensorFlow model draws them (`model.logits_initializer`):
    Keras's VarianceScaling(2, fan_out, truncated normal), a normal of sigma sqrt(2 / classes)
    / 0.8796 cut at 2 sigma, or pytorch/resnet.py's normal of 0.01 ("normal_0.01")."""
    if initializer == "variance_scaling":
        sigma = math.sqrt(2.0 / fc.out_features) / 0.87962566103423978
        torch.nn.init.trunc_normal_(fc.weight, std=sigma, a=-2 * sigma, b=2 * sigma)
    else:
        torch.nn.init.normal_(fc.weight, std=0.01)


def run(setup: Setup, options: RunOptions, view=None) -> tuple[dict | None, Path | None]:
    """Run the benchmark on PyTorch (see lifecycle.run), in a process that then refuses to
    load TensorFlow (pytorch/feeder.py says why; the tensorboard package would otherwise use
    it for its files)."""
    sys.modules["tensorflow"] = None  # an import of it fails here, loudly
    try:
        return run_lifecycle(setup, options, TorchTrainer, view)
    except FeederError as error:  # before the timed run: mid-run, it is the run's status
        raise UserError(f"the TensorFlow data process failed: {error}") from None


def end_worker(code: int) -> None:
    """End a worker of a multi-worker run now, with `code`, its output flushed: its process
    group was left when its trainer closed, and the interpreter's teardown of gloo's threads
    after that sometimes aborts the process ("terminate called without an active exception",
    SIGABRT), which would turn a finished run into a failed task."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class TorchTrainer(Trainer):
    """The PyTorch model, optimizer and steps as the lifecycle's trainer (run/trainer.py)."""

    framework = "pytorch"

    def __init__(self, setup: Setup, options: RunOptions, view=None):
        torch = self.torch = import_torch()
        from hpcai500_tf.pytorch.resnet import ResNet50V15

        t, o = setup.training, setup.optimizer
        if setup.benchmark.name != "image_classification":
            raise UserError("the PyTorch runner trains image_classification only")
        if o.name != "sgd":
            raise UserError("the PyTorch runner implements SGD only, not LARS")
        self.setup, self.warnings = setup, []
        self.placement = distributed.workers_from_environment()
        self.workers, self.rank = self.placement.world_size, self.placement.rank
        asked = options.device
        if options.allow_cpu and asked == "auto" and not torch.cuda.is_available():
            asked = "cpu"  # on purpose, where this torch cannot use the machine's GPUs
            if nvidia_gpus_present():
                self.warnings.append(
                    "trained on the CPU (--allow-cpu): this machine's NVIDIA GPUs are not "
                    "usable by this torch"
                )
        device = choose_device(torch, asked)
        refuse_other_forms(setup, device.type == "cuda")
        if self.workers == 1 and (
            t.strategy not in ("default", "mirrored")
            or (t.strategy == "mirrored" and torch.cuda.device_count() > 1)
        ):
            raise UserError(
                "the PyTorch runner trains one device per process: several run as several "
                "workers (--workers N, torchrun or srun)"
            )
        refuse_unshardable_config(setup, self.workers)  # before the rendezvous and the data
        timeout_s = setup.communication.timeout_s or 1800.0
        join_s = setup.communication.join_timeout_s if self.placement.several else 0
        message = (
            f"not every worker joined within {join_s:g} s (rank 0 at "
            f"{self.placement.master_addr}:{self.placement.master_port}); check that all were "
            "started (communication.join_timeout_s)"
        )
        with JoinWatchdog(join_s, message):  # the rendezvous ends by its deadline, not c10d's
            self.device = distributed.init_process_group(torch, self.placement, device, timeout_s)
        distributed.mark_computing_gpu(os.environ, torch, self.device)  # L1's and the energy's
        self.global_batch = t.batch_per_replica * self.workers
        # TensorFlow feeds the data from a process of its own (see pytorch/feeder.py): this
        # worker's part of the training and evaluation data, a replica's batch at a time.
        self.feeder = Feeder(
            setup.benchmark.name, setup.config, options.data_dir, t.batch_per_replica,
            t.deterministic, shard=(self.workers, self.rank),
        )  # fmt: skip
        try:
            self._build(torch, setup, ResNet50V15)
        except BaseException:
            self.close()
            raise
        for warning in self.warnings if view and self.rank == 0 else ():
            view.message(warning)

    def _build(self, torch, setup: Setup, resnet) -> None:
        t, o = setup.training, setup.optimizer
        self.workload = self.feeder.workload
        self.warnings += self.workload.data_warnings  # e.g. fewer validation files than workers
        self.steps_per_epoch = full_batch_steps(self.workload.train_examples, self.global_batch)
        if self.workers > 1:
            refuse_unshardable_evaluation(self.workload.eval_examples, self.workers)
            config_id = fingerprint(setup.config)
            agreed = distributed.same_on_all_workers(torch, self.placement, config_id)
            refuse_disagreeing_workers(agreed, config_id)
        torch.manual_seed(t.seed)
        if t.deterministic:  # this call imports torch._inductor (and triton, where present)
            torch.use_deterministic_algorithms(True)
        m = self.workload.model
        model = resnet(self.workload.num_classes, m["width"], tuple(m["blocks"]))
        initialise_logits(torch, model.fc, m.get("logits_initializer", "normal_0.01"))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum, module.eps = 1.0 - m["bn_momentum"], m["bn_epsilon"]
                if not m["zero_init_residual"]:
                    torch.nn.init.ones_(module.weight)
        self.module = model.to(self.device, memory_format=torch.channels_last)
        # Every worker starts from the chief's weights; its gradients are averaged over all,
        # and on several workers so is its stop vote (pytorch/stop_vote.py).
        self.ballot, wrapped = None, self.module
        if self.placement.several:
            wrapped = stop_vote.voting_model(torch, self.module, self.device)
        self.model = distributed.wrap_model(torch, wrapped, self.placement, self.device)
        if wrapped is not self.module:
            self.ballot = stop_vote.Ballot(torch, wrapped.ballot, self.workers)
        # The stop votes the last steps carried in their gradient all-reduce (run/stop.py).
        self.votes = stop.PendingVotes(lambda summed: summed.cpu().tolist())
        decayed, kept = [], []
        for parameter in self.module.parameters():
            is_bn_or_bias = parameter.ndim == 1
            (kept if is_bn_or_bias and not o.decay_all_variables else decayed).append(parameter)
        self.optimizer = torch.optim.SGD(
            [
                {"params": decayed, "weight_decay": o.weight_decay},
                {"params": kept, "weight_decay": 0.0},
            ],
            lr=0.0,
            momentum=o.momentum,
        )
        self.decayed = decayed
        self.loss_fn = loss_function(torch, self.workload.objective, o.label_smoothing)
        self.correct = correct_count(self.workload.quality_metric)
        self.schedule = warmup_decay(o, self.global_batch, self.steps_per_epoch, t.epochs)
        self.mixed = t.precision != "fp32"
        self.precision = precision_policy_on(t.precision, self.device.type == "cuda")
        self.scaler = torch.amp.GradScaler(
            "cuda",
            init_scale=INITIAL_LOSS_SCALE,
            enabled=self.precision == "mixed_float16" and self.device.type == "cuda",
        )
        self.initial_loss_scale = INITIAL_LOSS_SCALE if self.scaler.is_enabled() else None
        self.step = 0
        # The updates applied: the schedule's step. A float16 step that GradScaler skips for
        # an overflow applies none and moves the schedule no further, as Keras's schedule
        # follows its inner optimizer's iterations. Counted by the optimizer's own hook (no
        # read of the device: GradScaler has already read whether to step).
        self.updates = 0
        self.optimizer.register_step_post_hook(self._count_update)
        self._predictions = None  # an ensemble member's last evaluation's (`evaluate`)
        if self.mixed:
            check_mixed_precision(torch, self.device, self.precision)

    def _count_update(self, optimizer, args, kwargs) -> None:
        self.updates += 1

    # ------------------------------------------------------------------ data

    def _batches(self, training: bool, seed: int):
        """The feeder's stream, opened now, as tensors on the device."""
        return self._on_device(self.feeder.batches(training, seed))

    def _on_device(self, stream):
        torch = self.torch
        for images, labels, _ in stream:
            # Copied out of the feeder's shared slot, which is refilled after the next request.
            x = torch.from_numpy(images).permute(0, 3, 1, 2)  # NHWC -> NCHW view
            yield (
                x.to(self.device, memory_format=torch.channels_last, copy=True),
                torch.from_numpy(labels).to(self.device, copy=True),
            )

    def train_batches(self, epochs_done: int, batches_done: int = 0):
        """The training stream from this position on, every epoch's own, seeded as the
        TensorFlow engine's (run/data_position.py)."""
        t = self.setup.training
        position = (epochs_done, batches_done, t.epochs, self.steps_per_epoch)
        return self._on_device(self.feeder.batches(True, t.seed, position))

    def agreed_stop(self) -> int:
        """The stop every worker agrees on (run/stop.py); at a stop mid-epoch, every worker's
        batch-norm statistics averaged first, as at an epoch's end (their running means are
        linear in them, so a resumed run's next average is an uninterrupted run's)."""
        agreed = self.votes.agreed()
        if agreed and self.step % self.steps_per_epoch:
            distributed.average_buffers(self.torch, self.placement, self.module)
        return agreed

    # ------------------------------------------------------------------ steps

    def _autocast(self):
        dtype = self.torch.float16 if self.precision == "mixed_float16" else self.torch.bfloat16
        return self.torch.autocast(self.device.type, dtype=dtype, enabled=self.mixed)

    def train_step(self, batch, vote: int | None = None):
        """One step; returns the loss tensor (reading it syncs the device). `vote`: this
        worker's stop signal (0: none), summed over the workers by the gradient all-reduce
        and kept in `votes` (None: none kept; one worker: none carried)."""
        images, labels = batch
        rate = self.schedule.rate(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.model.train()
        with self._autocast():
            loss = self.loss_fn(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        differentiated = self.scaler.scale(loss)
        if self.ballot is not None:  # on every step: DDP waits for each parameter
            differentiated = differentiated + self.ballot.term(vote or 0)
        differentiated.backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.ballot is not None and vote is not None:
            self.votes.push(self.ballot.summed())
        self.step += 1
        if self.workers > 1 and self.step % self.steps_per_epoch == 0:
            # Every worker's batch-norm statistics, the mean over all at each epoch's end, as
            # a Keras batch norm's under a tf.distribute strategy: what evaluation and a
            # checkpoint (the chief's) read.
            distributed.average_buffers(self.torch, self.placement, self.module)
        return loss

    def loss_value(self, loss) -> float:
        """The loss as the TensorFlow engine reports it: the mean over every worker's batch,
        with its weight-decay term (the same on every worker, so all of them see a NaN)."""
        decay = self.setup.optimizer.weight_decay
        l2 = 0.0
        if decay:
            with self.torch.no_grad():  # one fused norm (clip_grad_norm_'s) and one device sync
                norms = self.torch._foreach_norm(self.decayed)
                l2 = float(self.torch.stack(norms).float().pow(2).sum())
        value = float(loss.detach())
        if self.workers > 1:
            rows = distributed.all_gather_rows(self.torch, self.placement, [value])
            value = sum(row[0] for row in rows) / len(rows)
        return value + decay * l2 / 2

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def evaluate(self) -> float:
        """The workload's quality metric (top-1 accuracy) over the evaluation split: each
        worker's part, summed over all. An ensemble member keeps its probabilities too
        (`predictions`)."""
        torch, correct, count = self.torch, 0, 0
        kept = [] if self.workload.keeps_predictions else None
        self.model.eval()
        with torch.no_grad(), self._autocast():
            for images, labels in self._batches(False, self.setup.training.seed):
                logits = self.module(images)
                correct += self.correct(logits, labels)
                count += len(labels)
                if kept is not None:
                    kept.append((probabilities(torch, logits), labels))
        if self.workers > 1:
            rows = distributed.all_gather_rows(torch, self.placement, [correct, count])
            correct, count = sum(r[0] for r in rows), sum(r[1] for r in rows)
        if count == 0:
            raise UserError("the evaluation split produced no examples")
        if kept is not None:
            self._predictions = self._gathered(kept)
        return correct / count

    def _gathered(self, kept: list) -> dict:
        """This worker's kept (probabilities, labels) batches and every other worker's, as
        the whole evaluation split's in evaluation-set order (run/predictions.py)."""
        torch, held = self.torch, {}
        for key, column in (("probabilities", 0), ("labels", 1)):
            mine = torch.cat([batch[column] for batch in kept])
            parts = distributed.all_gather_tensors(torch, self.placement, mine)
            held[key] = predictions.in_evaluation_order([part.numpy() for part in parts])
        return held

    @property
    def predictions(self) -> dict | None:
        return self._predictions

    def _zero_batch(self):
        size, batch = self.workload.image_size, self.setup.training.batch_per_replica
        images = self.torch.zeros(batch, 3, size, size, device=self.device).contiguous(
            memory_format=self.torch.channels_last
        )
        return images, self.torch.zeros(batch, dtype=self.torch.long, device=self.device)

    def warm_up(self, checkpoints: bool) -> None:
        """One step on a zero batch, then every parameter, buffer and optimizer state back
        (a checkpoint is a torch.save: nothing of it to warm up)."""
        model_state = copy.deepcopy(self.module.state_dict())
        optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        position, scaler_state = (self.step, self.updates), copy.deepcopy(self.scaler.state_dict())
        # The step the run takes: on several workers, the one carrying a stop vote.
        float(self.train_step(self._zero_batch(), 0 if self.workers > 1 else None).detach())
        self.votes.clear()
        self.module.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)
        self.scaler.load_state_dict(scaler_state)
        self.step, self.updates = position  # a resumed run's schedule goes on from its checkpoint

    def count_flops(self) -> dict:
        from torch.utils.flop_counter import FlopCounterMode

        torch, (images, labels) = self.torch, self._zero_batch()
        model_state = copy.deepcopy(self.module.state_dict())
        self.module.train()
        with FlopCounterMode(display=False) as counter:
            with self._autocast():
                loss = self.loss_fn(self.module(images), labels)
            loss.backward()
        training = counter.get_total_flops()
        by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        self.module.zero_grad(set_to_none=True)
        self.module.eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad(), self._autocast():
            self.module(images)
        forward = counter.get_total_flops()
        self.module.load_state_dict(model_state)
        batch = len(images)
        return flops_block(
            per_example_training=training / batch,
            per_example_forward=forward / batch,
            analytical_per_example_forward=self.analytical_forward_flops(),
            method=(
                "torch.utils.flop_counter.FlopCounterMode over one train step (forward and "
                f"backward; the SGD update is not counted) at batch {batch}"
                + (f" (per worker; global batch {self.global_batch})" if self.workers > 1 else "")
                + "; multiply-add = 2"
            ),
            basis="pytorch-flop-counter",
            by_op_type=by_op,
            batch=batch,
            uncounted_op_types=[],
        )

    def analytical_forward_flops(self) -> float:
        """2 x multiply-adds of every convolution and dense layer, for one example."""
        torch, total = self.torch, []

        def conv(module, _, output):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels
            total.append(2 * k // module.groups * output[0].numel())

        def dense(module, _, output):
            total.append(2 * module.in_features * module.out_features)

        hooks = [
            m.register_forward_hook(conv if isinstance(m, torch.nn.Conv2d) else dense)
            for m in self.module.modules()
            if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)
        ]
        size = self.workload.image_size
        self.module.eval()
        with torch.no_grad():
            self.module(torch.zeros(1, 3, size, size, device=self.device))
        for hook in hooks:
            hook.remove()
        return float(sum(total))

    # ------------------------------------------------------------------ checkpoints

    def write_checkpoint(self, prefix: Path, epochs_done: int, batches_done: int = 0) -> Path:
        """Model, optimizer, loss scale and step in PREFIX.pt (written beside, then renamed:
        never half a file under the name)."""
        path = prefix.with_name(prefix.name + ".pt")
        scratch = path.with_name(path.name + ".tmp")
        state = {
            "epochs_done": epochs_done,
            "batches_done": batches_done,
            "step": self.step,
            "updates": self.updates,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
        }
        try:
            with open(scratch, "wb") as handle:
                self.torch.save(state, handle)
                handle.flush()
                os.fsync(handle.fileno())  # on disk before state.json names it
            os.replace(scratch, path)
        except BaseException as error:
            scratch.unlink(missing_ok=True)
            if isinstance(error, OSError | RuntimeError):  # RuntimeError: torch's writer's
                raise checkpoint_unwritable(path, error) from None
            raise
        return prefix

    def read_checkpoint(self, prefix: Path) -> tuple[int, int]:
        """The model, optimizer, loss scale and step of PREFIX.pt, which must read whole;
        returns the epochs (and batches of the next) it holds."""
        path = prefix.with_name(prefix.name + ".pt")
        try:
            state = self.torch.load(path, map_location=self.device, weights_only=True)
            held = int(state["epochs_done"])
            batches = int(state.get("batches_done", 0))  # 0: written before stops kept them
        except Exception as error:  # noqa: BLE001 - a damaged file raises many kinds
            raise checkpoint_damaged(path, error) from None
        try:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            step = int(state["step"])
            updates = int(state.get("updates", step))  # written before skips were counted
        except (KeyError, RuntimeError, ValueError, TypeError) as error:
            raise checkpoint_unrestorable(path, error) from None
        expected = held * self.steps_per_epoch + batches
        if step != expected:
            more = f" and {batches} batches" if batches else ""
            raise UserError(
                f"{path}: holds step {step}, not the {expected} steps of "
                f"{held} epochs{more} at this batch: resume refused"
            )
        if not 0 <= updates <= step:
            raise UserError(
                f"{path}: holds {updates} updates applied in {step} steps: resume refused"
            )
        self.step, self.updates = step, updates
        return held, batches

    def step_trace(self, log_dir: Path, first: int, last: int):
        return TorchStepTrace(self.torch, self.device, log_dir, first, last)

    # ------------------------------------------------------------------ the run's facts

    def explain(self, error: BaseException) -> Failure | None:
        """Bad data the feeder process met, or a peer lost to torch.distributed."""
        if isinstance(error, FeederDataError):
            return Failure("data", str(error))
        if isinstance(error, FeederError):
            return Failure("failed", str(error))
        if self.workers > 1 and distributed.peer_lost(error):
            return Failure("peer_lost", first_line(error))
        return None

    def gather_rows(self, row: list[float]) -> list[list[float]]:
        return distributed.all_gather_rows(self.torch, self.placement, row)

    @property
    def replicas(self) -> int:
        return self.workers  # one device each

    def communication_layer(self) -> dict:
        """L3: torch.distributed's backend on several workers, none on one."""
        if self.workers == 1:
            return {"collective_implementation": None, "note": "single device: no collectives"}
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        return {
            "collective_implementation": f"torch.distributed {backend}",
            "workers": self.workers,
            "started_by": self.placement.source,
        }

    def library_layers(self) -> tuple[dict, dict]:
        """L4 and L5 as this torch reports them."""
        return build.library_layers(self.torch)

    def intra_op_threads(self) -> int:
        return self.torch.get_num_threads()

    def close(self) -> None:
        feeder = getattr(self, "feeder", None)
        if feeder:
            feeder.close()
        distributed.shutdown(self.torch)


class TorchStepTrace(StepTrace):
    """A torch.profiler trace of global train steps `first`..`last` (counted from 1), written
    under the TensorBoard directory as a Chrome trace (TensorBoard's PyTorch profiler plugin
    reads it; so does chrome://tracing or Perfetto)."""

    profiler = "torch.profiler"
    pattern = "*.pt.trace.json"

    def __init__(self, torch, device, log_dir: Path, first: int, last: int):
        super().__init__(log_dir, first, last)
        self.torch, self.device = torch, device
        self.profile = None

    def start(self) -> None:
        profiler = self.torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(profiler.ProfilerActivity.CUDA)
        self.profile = profiler.profile(
            activities=activities,
            on_trace_ready=profiler.tensorboard_trace_handler(str(self.log_dir)),
        )
        self.profile.start()

    def finish(self) -> None:
        profile, self.profile = self.profile, None
        profile.stop()  # writes the trace (on_trace_ready)

    def wait(self, loss) -> None:
        float(loss.detach())
