"""Make the converter-produced .tflite fixtures in tests/fixtures/ (dev-only, needs tensorflow-cpu).

latpred never depends on TensorFlow; this script only exists so the reader is tested on files
TensorFlow's own converter wrote. Run it in a separate environment:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu
    /tmp/tfvenv/bin/python scripts/make_fixtures.py

For each model it writes `<name>.tflite` and `<name>.json` holding what the Keras model says
(input/output shapes, each layer's output shape), which tests/test_tflite_reader.py compares
against what the reader sees. Weights are seeded, so reruns differ only if TensorFlow changes.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def small_cnn(batch: int | None = 1, size: int | None = 32) -> keras.Model:
    x = keras.Input((size, size, 3), batch_size=batch, name="image")
    y = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    y = layers.DepthwiseConv2D(3, strides=2, padding="same")(y)
    y = layers.ReLU(max_value=6.0)(y)
    y = layers.Conv2D(16, 1, activation="relu")(y)
    y = layers.MaxPooling2D(2)(y)
    y = layers.AveragePooling2D(2, padding="same")(y)
    y = layers.GlobalAveragePooling2D()(y)
    y = layers.Dense(10)(y)
    y = layers.Softmax()(y)
    return keras.Model(x, y, name="small_cnn")


def grouped_conv() -> keras.Model:
    x = keras.Input((16, 16, 8), batch_size=1, name="x")
    y = layers.Conv2D(16, 3, padding="same", groups=4, activation="relu")(x)
    y = layers.Conv2D(16, 3, strides=2, padding="valid", dilation_rate=1, groups=2)(y)
    y = layers.Conv2D(8, 3, padding="same", dilation_rate=2)(y)
    return keras.Model(x, y, name="grouped_conv")


def _hard_swish(y):
    return layers.Multiply()([y, layers.ReLU(6.0)(y + 3.0) * (1.0 / 6.0)])


def mbv2_block() -> keras.Model:
    x = keras.Input((16, 16, 16), batch_size=1, name="x")
    y = layers.Conv2D(64, 1, use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = _hard_swish(y)
    y = layers.DepthwiseConv2D(3, padding="same")(y)
    y = layers.BatchNormalization()(y)
    y = _hard_swish(y)
    s = layers.GlobalAveragePooling2D(keepdims=True)(y)
    s = layers.Conv2D(16, 1, activation="relu")(s)
    s = layers.Conv2D(64, 1, activation="hard_sigmoid")(s)
    y = layers.Multiply()([y, s])
    y = layers.Conv2D(16, 1, use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    y = layers.Add()([x, y])
    y = layers.ZeroPadding2D(1)(y)
    y = layers.Conv2D(16, 3, strides=2, activation="sigmoid")(y)
    return keras.Model(x, y, name="mbv2_block")


def tiny_vit(tokens: int = 16, dim: int = 32, heads: int = 4) -> keras.Model:
    x = keras.Input((16, 16, 3), batch_size=1, name="image")
    p = layers.Conv2D(dim, 4, strides=4)(x)                      # patch embedding
    t = layers.Reshape((tokens, dim))(p)
    h = layers.LayerNormalization(epsilon=1e-6)(t)
    qkv = layers.Dense(3 * dim)(h)
    qkv = layers.Reshape((tokens, 3, heads, dim // heads))(qkv)
    qkv = layers.Permute((2, 3, 1, 4))(qkv)                      # (3, heads, tokens, d)
    q, k, v = (layers.Lambda(lambda z, i=i: z[:, i])(qkv) for i in range(3))
    a = layers.Lambda(lambda z: tf.matmul(z[0], z[1], transpose_b=True) * 0.25)([q, k])
    a = layers.Softmax()(a)
    o = layers.Lambda(lambda z: tf.matmul(z[0], z[1]))([a, v])   # (heads, tokens, d)
    o = layers.Permute((2, 1, 3))(o)
    o = layers.Reshape((tokens, dim))(o)
    t = layers.Add()([t, layers.Dense(dim)(o)])
    h = layers.LayerNormalization(epsilon=1e-6)(t)
    h = layers.Dense(2 * dim, activation="gelu")(h)
    t = layers.Add()([t, layers.Dense(dim)(h)])
    y = layers.GlobalAveragePooling1D()(t)
    y = layers.Dense(10, activation="tanh")(y)
    return keras.Model(x, y, name="tiny_vit")


def _facts(model: keras.Model) -> dict:
    def shape(t):
        return [d if d is not None else -1 for d in t.shape]

    return {"name": model.name,
            "inputs": [shape(t) for t in model.inputs],
            "outputs": [shape(t) for t in model.outputs],
            "layers": {layer.name: shape(layer.output) for layer in model.layers[1:]
                       if not isinstance(layer.output, (list, tuple))}}


def _convert(model: keras.Model, int8: bool = False) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        rng = np.random.default_rng(0)
        shape = [1 if d is None else d for d in model.inputs[0].shape]

        def samples():
            for _ in range(16):
                yield [rng.standard_normal(shape).astype(np.float32)]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = samples
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def main() -> int:
    keras.utils.set_random_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = [("small_cnn", small_cnn(), False), ("small_cnn_dynamic", small_cnn(None), False),
            ("small_cnn_dynamic_hw", small_cnn(None, None), False),
            ("small_cnn_int8", small_cnn(), True), ("grouped_conv", grouped_conv(), False),
            ("mbv2_block", mbv2_block(), False), ("tiny_vit", tiny_vit(), False)]
    only = set(sys.argv[1:])
    for name, model, int8 in jobs:
        if only and name not in only:
            continue
        data = _convert(model, int8)
        (OUT / f"{name}.tflite").write_bytes(data)
        facts = {**_facts(model), "int8": int8, "tensorflow": tf.__version__}
        (OUT / f"{name}.json").write_text(json.dumps(facts, indent=1) + "\n")
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
