"""The values of `model.kernels` and what each runs batch normalisation as: pure Python, read
by the config checks (workloads.settings) and the record (L7) without TensorFlow."""

# `model.kernels`: "auto", or a kernel set by name; see models/kernels.py
KERNEL_CHOICES = (
    "auto",
    "stock",
    "cpu-workarounds",
    "cpu-native-batch-norm",
    "gpu-fused-batch-norm",
)
# What each resolved choice runs batch normalisation as (L7 `batch_norm`), by the name
# models/kernels.py resolves it to: "auto" is the CPU workarounds without a GPU, fused batch
# norm with stock layers on GPUs.
BATCH_NORM_KERNELS = {
    "cpu-workarounds": "fused (FusedBatchNormV3)",
    "cpu-native-batch-norm": "fused, the project's own kernel with the ReLU (HpcaiBatchNorm)",
    "gpu-fused-batch-norm": "fused (FusedBatchNormV3: cuDNN on GPUs)",
    # Keras 3's BatchNormalization (moments and normalisation as separate ops); the PyTorch
    # runner's stock torch.nn.BatchNorm2d: the same name for both, as they are each one's own
    "stock": "the framework's own batch-norm layer",
}
# Kernel sets whose train steps the FLOP count reads alike (the same ops carry a count; the
# native batch norm's residual add is counted as AddV2 is, `tests/test_native_batch_norm.py`),
# named in a record's FLOP basis by the set they are counted as.
COUNTED_AS = {"cpu-native-batch-norm": "cpu-workarounds"}
