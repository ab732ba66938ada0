"""The PyTorch side of the framework comparison (L5): `hpcai500-tf train --framework pytorch`.

A process that runs torch never loads TensorFlow (`train.run` makes sure): the input pipeline
runs in a process of its own (`feeder`), the model is plain torch.nn (`resnet`), and `build`
finds a torch this runner can use. Installed with the `torch` extra.
"""
