import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.models import resnet


@pytest.fixture(scope="module")
def resnet50():
    return resnet.resnet50_v15(image_size=224, num_classes=1000)


def test_stride_sits_in_the_3x3_conv(resnet50):
    """v1.5: the downsampling block strides in its 3x3 conv, not in its first 1x1 conv."""
    for stage in (3, 4, 5):
        assert resnet50.get_layer(f"stage{stage}_block1_1_conv").strides == (1, 1)
        assert resnet50.get_layer(f"stage{stage}_block1_2_conv").strides == (2, 2)
        assert resnet50.get_layer(f"stage{stage}_block1_proj_conv").strides == (2, 2)
    assert resnet50.get_layer("stage2_block1_2_conv").strides == (1, 1)


def test_parameter_count_is_resnet50(resnet50):
    trainable = sum(int(np.prod(v.shape)) for v in resnet50.trainable_variables)
    assert trainable == 25_557_032  # the published ResNet-50 count (1000 classes)


def test_profiled_forward_flops_match_the_analytical_count(resnet50):
    forward = tf.function(lambda x: resnet50(x, training=False))
    counted = count_function(forward, tf.zeros([2, 224, 224, 3]), batch=2)
    analytical = resnet.analytical_forward_flops(resnet50)
    assert analytical == pytest.approx(2 * 4.09e9, rel=0.002)  # SPEC: 4.09 GMACs (v1.5)
    assert counted.per_example == pytest.approx(2 * 4.09e9, rel=0.01)
    assert counted.by_op_type["Conv2D"] / 2 == pytest.approx(analytical - 2 * 2048 * 1000)


def test_a_none_batch_is_refused():
    model = resnet.resnet50_v15(image_size=32, num_classes=10, width=0.125, blocks=(1, 1, 1, 1))
    forward = tf.function(lambda x: model(x, training=False))
    with pytest.raises(ValueError, match="fixed batch"):
        count_function(forward, tf.TensorSpec([None, 32, 32, 3]), batch=1)
