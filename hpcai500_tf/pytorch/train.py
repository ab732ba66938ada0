"""The PyTorch reference runner: trains a benchmark preset in plain PyTorch and writes the same
record and MLPerf log as `hpcai500-tf train`, so the framework layer (L5) can be compared.

    hpcai500-tf train image_classification --framework pytorch [--preset smoke] [--set K=V]
        [--data DIR] [--out runs] [--power-hz 10] [--meter-log FILE] [--device auto]

What is shared with the TensorFlow side, so that only the framework differs:
- the config (presets, `--set`) and everything derived from it: hyperparameters, schedule,
  target, epochs, seed;
- the input pipeline: the same tf.data datasets (procedural gratings, or the ImageNet
  TFRecord shards with the reference preprocessing), handed to PyTorch as arrays;
- the model's architecture (ResNet-50 v1.5, pytorch/resnet.py, defined here because
  torchvision cannot import beside the CPU torch wheel), the loss (cross-entropy with label
  smoothing), SGD with momentum and coupled weight decay, warmup then cosine or step decay;
- time accounting (initialisation, tracing and a warm-up step whose effect is undone come
  before run_start), power sampling, the record schema and the MLPerf log.

What differs: the framework and its kernels. FLOPs are counted with
torch.utils.flop_counter.FlopCounterMode over one train step (forward and backward) at the
batch that runs. Momentum follows PyTorch's form (buffer = m x buffer + g; w -= lr x buffer),
which is TF1's (`optimizer.momentum_form = "tf1"`, the reference's); a config asking for
Keras's form, Keras's "same" padding of strided convolutions (the model pads them
symmetrically, as the reference does) or a fixed float16 loss scale is refused. Single
process only (training.strategy default, or mirrored on one device); SGD only (LARS is
refused).
"""

from __future__ import annotations

import copy
import math
import sys
import time

from hpcai500_tf.config import peak_learning_rate, precision_policy_on
from hpcai500_tf.errors import ArgumentParser, UserError
from hpcai500_tf.pytorch.build import (
    check_mixed_precision,
    choose_device,
    import_torch,
    torch_build,
)
from hpcai500_tf.pytorch.feeder import Feeder, FeederError
from hpcai500_tf.tensorflow_import import keep_tensorflow_quiet


def learning_rate(step: int, steps_per_epoch: int, epochs: int, peak: float, optimizer) -> float:
    """The TensorFlow engine's schedule (engine/optimizers.py WarmupDecay), step by step."""
    warmup = int(round(optimizer.warmup_epochs * steps_per_epoch))
    if warmup and step < warmup:
        return peak * step / warmup
    if optimizer.schedule == "cosine":
        start = 0 if optimizer.cosine_start == "step_0" else warmup
        span = max(epochs * steps_per_epoch - start, 1)
        progress = min(max((step - start) / span, 0.0), 1.0)
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    passed = sum(step >= b * steps_per_epoch for b in optimizer.step_boundaries)
    return peak * optimizer.step_factor**passed


def refuse_other_forms(setup, on_cuda: bool) -> None:
    """One line for a form this runner does not train (see the module's docstring): Keras's
    momentum, Keras's "same" padding of strided convolutions, a fixed float16 loss scale."""
    o = setup.optimizer
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


def initialise_logits(torch, fc, initializer: str) -> None:
    """The logits layer's weights as the TensorFlow model draws them (`model.logits_initializer`):
    Keras's VarianceScaling(2, fan_out, truncated normal), a normal of sigma sqrt(2 / classes)
    / 0.8796 cut at 2 sigma, or pytorch/resnet.py's normal of 0.01 ("normal_0.01")."""
    if initializer == "variance_scaling":
        sigma = math.sqrt(2.0 / fc.out_features) / 0.87962566103423978
        torch.nn.init.trunc_normal_(fc.weight, std=sigma, a=-2 * sigma, b=2 * sigma)
    else:
        torch.nn.init.normal_(fc.weight, std=0.01)


class TorchRunner:
    def __init__(self, setup, data_dir: str | None, device: str = "auto"):
        torch = self.torch = import_torch()
        from hpcai500_tf.pytorch.resnet import ResNet50V15

        t, o = setup.training, setup.optimizer
        if setup.benchmark.name != "image_classification":
            raise UserError("the PyTorch runner trains image_classification only")
        if o.name != "sgd":
            raise UserError("the PyTorch runner implements SGD only, not LARS")
        self.device = choose_device(torch, device)
        refuse_other_forms(setup, self.device.type == "cuda")
        if t.strategy not in ("default", "mirrored") or (
            t.strategy == "mirrored" and torch.cuda.device_count() > 1
        ):
            raise UserError("the PyTorch runner trains in one process on one device")
        self.setup = setup
        self.global_batch = t.batch_per_replica
        # TensorFlow feeds the data from a process of its own (see pytorch/feeder.py).
        self.feeder = Feeder(
            setup.benchmark.name, setup.config, data_dir, self.global_batch, t.deterministic
        )
        self.workload = self.feeder.workload
        self.steps_per_epoch = self.workload.train_examples // self.global_batch
        if self.steps_per_epoch < 1:
            raise UserError("the training data make no full batch: lower batch_per_replica")
        torch.manual_seed(t.seed)
        if t.deterministic:  # this call imports torch._inductor (and triton, where present)
            torch.use_deterministic_algorithms(True)
        m = self.workload.model
        self.model = ResNet50V15(self.workload.num_classes, m["width"], tuple(m["blocks"]))
        initialise_logits(torch, self.model.fc, m.get("logits_initializer", "normal_0.01"))
        for module in self.model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum, module.eps = 1.0 - m["bn_momentum"], m["bn_epsilon"]
                if not m["zero_init_residual"]:
                    torch.nn.init.ones_(module.weight)
        self.model = self.model.to(self.device, memory_format=torch.channels_last)
        decayed, kept = [], []
        for parameter in self.model.parameters():
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
        self.loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=o.label_smoothing)
        self.peak = peak_learning_rate(o, self.global_batch)
        self.mixed = t.precision != "fp32"
        self.precision = precision_policy_on(t.precision, self.device.type == "cuda")
        self.scaler = torch.amp.GradScaler(
            "cuda",
            init_scale=2.0**16,
            enabled=self.precision == "mixed_float16" and self.device.type == "cuda",
        )
        self.initial_loss_scale = 2.0**16 if self.scaler.is_enabled() else None
        self.step = 0
        if self.mixed:
            check_mixed_precision(torch, self.device, self.precision)

    # ------------------------------------------------------------------ data

    def batches(self, training: bool, seed: int):
        torch = self.torch
        for images, labels, _ in self.feeder.batches(training, seed):
            # Copied out of the feeder's shared slot, which is refilled after the next request.
            x = torch.from_numpy(images).permute(0, 3, 1, 2)  # NHWC -> NCHW view
            yield (
                x.to(self.device, memory_format=torch.channels_last, copy=True),
                torch.from_numpy(labels).to(self.device, copy=True),
            )

    # ------------------------------------------------------------------ steps

    def _autocast(self):
        dtype = self.torch.float16 if self.precision == "mixed_float16" else self.torch.bfloat16
        return self.torch.autocast(self.device.type, dtype=dtype, enabled=self.mixed)

    def train_step(self, images, labels):
        """One step; returns the loss tensor (reading it syncs the device)."""
        rate = learning_rate(
            self.step,
            self.steps_per_epoch,
            self.setup.training.epochs,
            self.peak,
            self.setup.optimizer,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.model.train()
        with self._autocast():
            loss = self.loss_fn(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.step += 1
        return loss

    def loss_with_decay(self, loss) -> float:
        """The loss as the TensorFlow engine reports it: with its weight-decay term."""
        with self.torch.no_grad():
            l2 = sum(float((p.float() ** 2).sum()) for p in self.decayed) / 2
        return float(loss.detach()) + self.setup.optimizer.weight_decay * l2

    def evaluate(self) -> float:
        correct = count = 0
        self.model.eval()
        with self.torch.no_grad(), self._autocast():
            for images, labels in self.batches(False, self.setup.training.seed):
                correct += int((self.model(images).argmax(1) == labels).sum())
                count += len(labels)
        if count == 0:
            raise UserError("the evaluation split produced no examples")
        return correct / count

    def zero_batch(self):
        size = self.workload.image_size
        images = self.torch.zeros(self.global_batch, 3, size, size, device=self.device).contiguous(
            memory_format=self.torch.channels_last
        )
        return images, self.torch.zeros(
            self.global_batch, dtype=self.torch.long, device=self.device
        )

    def warm_up(self) -> None:
        """One step on a zero batch, then every parameter, buffer and optimizer state back."""
        model_state = copy.deepcopy(self.model.state_dict())
        optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        float(self.train_step(*self.zero_batch()).detach())
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)
        self.step = 0

    def count_flops(self) -> dict:
        from torch.utils.flop_counter import FlopCounterMode

        torch, images, labels = self.torch, *self.zero_batch()
        model_state = copy.deepcopy(self.model.state_dict())
        self.model.train()
        with FlopCounterMode(display=False) as counter:
            with self._autocast():
                loss = self.loss_fn(self.model(images), labels)
            loss.backward()
        training = counter.get_total_flops()
        by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        self.model.zero_grad(set_to_none=True)
        self.model.eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad(), self._autocast():
            self.model(images)
        forward = counter.get_total_flops()
        self.model.load_state_dict(model_state)
        batch = self.global_batch
        return {
            "per_example_training": training / batch,
            "per_example_forward": forward / batch,
            "analytical_per_example_forward": self.analytical_forward_flops(),
            "method": (
                "torch.utils.flop_counter.FlopCounterMode over one train step (forward and "
                f"backward; the SGD update is not counted) at batch {batch}; multiply-add = 2"
            ),
            "basis": "pytorch-flop-counter",
            "counted_op_types": sorted(by_op),
            "uncounted_op_types": [],
            "by_op_type_per_example": {k: v / batch for k, v in sorted(by_op.items())},
        }

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
            for m in self.model.modules()
            if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)
        ]
        size = self.workload.image_size
        self.model.eval()
        with torch.no_grad():
            self.model(torch.zeros(1, 3, size, size, device=self.device))
        for hook in hooks:
            hook.remove()
        return float(sum(total))

    # ------------------------------------------------------------------ layers

    def layers(self) -> dict:
        import platform

        import numpy

        from hpcai500_tf import benchmark_layers

        torch = self.torch
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "L1": benchmark_layers.hardware_layer(),
            "L2": benchmark_layers.os_layer(),
            "L3": {"collective_implementation": None, "note": "single device: no collectives"},
            "L4": {
                "cuda_build": torch.version.cuda is not None,
                "cuda_version": torch.version.cuda,
                "cudnn_version": None if cudnn is None else str(cudnn),
                "rocm_build": torch.version.hip is not None,
                "onednn": torch.backends.mkldnn.is_available(),
            },
            "L5": {
                "framework": "pytorch",
                "framework_version": torch.__version__,
                "framework_build": torch_build(torch),
                "numpy_version": numpy.__version__,
                "python_version": platform.python_version(),
                "python_implementation": sys.implementation.name,
            },
            **benchmark_layers.run_layers(
                self.setup,
                self.workload,
                workers=1,
                replicas=1,
                global_batch=self.global_batch,
                precision=self.precision,
                initial_loss_scale=self.initial_loss_scale,
                intra_op_threads=torch.get_num_threads(),
            ),
        }


def train(
    setup,
    data_dir,
    out_dir,
    power_hz: float = 10.0,
    meter_log: str | None = None,
    device: str = "auto",
):
    """Train with PyTorch; returns (record, record path)."""
    init_start = time.time()
    runner = TorchRunner(setup, data_dir, device)
    try:
        return _train(runner, setup, out_dir, power_hz, meter_log, init_start)
    finally:
        runner.feeder.close()


def _train(runner, setup, out_dir, power_hz, meter_log, init_start):
    from hpcai500_tf import config
    from hpcai500_tf import record as record_io
    from hpcai500_tf.engine import run_record as run
    from hpcai500_tf.engine.mllog import MLLogger
    from hpcai500_tf.engine.run_record import Progress, fingerprint

    t = setup.training
    run_dir = record_io.new_run_dir(out_dir, setup.benchmark.name, setup.preset)
    record_io.write_atomic(run_dir / run.CONFIG_FILE, config.saved_config(setup))
    mllog = MLLogger(run_dir / run.MLPERF_LOG)
    mllog.start("init_start", time_ms=init_start * 1000)
    run.log_setup(mllog, setup, runner.global_batch, runner.workload)
    progress = Progress(config_fingerprint=fingerprint(setup.config), init_start=init_start)
    print("counting FLOPs of the train step, warming it up", flush=True)
    flops = runner.count_flops()
    runner.warm_up()
    mllog.end("init_stop")
    sampler, notes = run.start_power_sampling(power_hz)
    warnings, status = [], "completed"
    batches = runner.batches(True, t.seed)
    start = progress.run_start = time.time()
    mllog.start("run_start", time_ms=start * 1000)
    try:
        for epoch in range(t.epochs):
            mllog.start("epoch_start", metadata={"epoch_num": epoch + 1})
            mllog.start("block_start", metadata={"first_epoch_num": epoch + 1, "epoch_count": 1})
            epoch_start = time.time()
            for step in range(runner.steps_per_epoch):
                loss = runner.train_step(*next(batches))
                if (step + 1) % 10 == 0 or step + 1 == runner.steps_per_epoch:
                    value = runner.loss_with_decay(loss)
                    if not math.isfinite(value):
                        raise run.diverged(value, epoch + 1, step + 1)
            seconds = time.time() - epoch_start
            progress.examples += runner.steps_per_epoch * runner.global_batch
            progress.epochs_done = epoch + 1
            progress.epochs.append(
                {
                    "epoch": epoch + 1,
                    "elapsed_s": progress.elapsed(open_segment=start),
                    "examples": progress.examples,
                    "seconds": seconds,
                    "loss": value,
                }
            )
            mllog.end("block_stop", metadata={"first_epoch_num": epoch + 1})
            mllog.end("epoch_stop", metadata={"epoch_num": epoch + 1})
            rate = runner.steps_per_epoch * runner.global_batch / seconds
            print(f"epoch {epoch + 1:3d}  loss {value:.4f}  {rate:,.1f} examples/s", flush=True)
            if runner.workload.measures_quality and (
                (epoch + 1) % t.eval_every == 0 or epoch + 1 == t.epochs
            ):
                mllog.start("eval_start", metadata={"epoch_num": epoch + 1})
                quality = runner.evaluate()
                progress.curve.append(
                    {
                        "epoch": epoch + 1,
                        "elapsed_s": progress.elapsed(open_segment=start),
                        "examples": progress.examples,
                        "value": quality,
                    }
                )
                mllog.event("eval_accuracy", quality, metadata={"epoch_num": epoch + 1})
                mllog.end("eval_stop", metadata={"epoch_num": epoch + 1})
                print(f"          eval after epoch {epoch + 1}: quality {quality:.4f}", flush=True)
    except run.Diverged as error:
        status = "diverged"
        warnings.append(str(error))
    except KeyboardInterrupt:
        status = "stopped"
        warnings.append("interrupted by the user (the PyTorch runner cannot resume)")
    except FeederError as error:
        status, warning = run.data_failed(error)
        warnings.append(warning)
    finally:
        progress.segments.append({"start": start, "stop": time.time()})
        if sampler:
            sampler.stop()
            progress.energy.append(sampler.measure([(start, progress.segments[-1]["stop"])]))
            if sampler.sources:
                try:
                    sampler.write_samples(run_dir / run.POWER_SAMPLES)
                except (OSError, UserError) as error:  # post-processing: never lose the run
                    warnings.append(f"power samples not written: {error}")
    energy, energy_warnings = run.energy_result(progress, notes, power_hz, meter_log)
    mllog.end("run_stop", metadata={"status": "success" if status == "completed" else "aborted"})
    mllog.close()
    artifacts = {
        "run_dir": str(run_dir),
        "mlperf_log": str(run_dir / run.MLPERF_LOG),
        "checkpoints": None,
        "power_samples": str(run_dir / run.POWER_SAMPLES) if sampler and sampler.sources else None,
    }
    record = run.make_record(
        setup,
        runner.layers(),
        runner.workload,
        progress,
        flops,
        status,
        warnings + energy_warnings,
        artifacts,
        energy,
        framework="pytorch",
    )
    path = run_dir / run.RECORD_FILE
    record_io.save(path, record)
    return record, path


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="hpcai500-tf train --framework pytorch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("benchmark")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--data")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--power-hz", type=float, default=10.0)
    parser.add_argument("--meter-log")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPU where PyTorch sees one, else the CPU (refused on a machine whose "
        "NVIDIA GPUs this torch cannot use)",
    )
    args = parser.parse_args(argv)
    # This process must never load TensorFlow (pytorch/feeder.py says why): make an import of
    # it fail here, loudly, rather than crash later inside triton.
    sys.modules["tensorflow"] = None
    keep_tensorflow_quiet()  # inherited by the feeder process, which runs TensorFlow
    from hpcai500_tf import config
    from hpcai500_tf.energy.sampler import check_rate

    try:
        setup = config.prepare(args.benchmark, args.preset, args.set)
        check_rate("--power-hz", args.power_hz, may_be_off=True)
        record, path = train(setup, args.data, args.out, args.power_hz, args.meter_log, args.device)
    except UserError as error:
        print(f"hpcai500-tf: error: {error}", file=sys.stderr)
        return 2
    except FeederError as error:
        print(f"hpcai500-tf: the TensorFlow data process failed: {error}", file=sys.stderr)
        return 1
    print(f"record: {path}")
    if record["status"] != "completed":
        print(f"run {record['status']}: " + "; ".join(record["warnings"]), file=sys.stderr)
        return 1
    if record["quality"]["measured"]:
        from hpcai500_tf import scoring
        from hpcai500_tf.report.console import console, score_table

        benchmark = config.load_benchmark(record["benchmark"])
        console.print(score_table(str(path), record, scoring.score(record, benchmark)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
