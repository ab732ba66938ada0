"""HPC AI500 V2.0 in TensorFlow/Keras: train to a target quality, count FLOPs, score Valid FLOPS."""

__version__ = "0.1.0"
