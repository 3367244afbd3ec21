"""Make the converter corpus: real architectures written by TensorFlow's own converter (dev-only).

latpred must read, deduce, measure and predict the files users really have. Most `.tflite`
files come from `TFLiteConverter.from_keras_model`, which marks every input's batch dynamic and
writes idioms latpred's own writer never produces (the SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE
chain of every squeeze-and-excite block, MEAN-based SE, HARD_SWISH, PAD before VALID convs).
This script converts `keras.applications` models (random, seeded weights: latency does not
depend on the values) into a folder latpred can profile:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu
    /tmp/tfvenv/bin/python scripts/converter_corpus.py --out out/corpus [--only NAME ...]
    /tmp/tfvenv/bin/python scripts/converter_corpus.py --fixtures   # small ones -> tests/fixtures/corpus

Each model gets `<name>.tflite` and `<name>.json` (what Keras says: family, input/output shapes,
parameter count, TensorFlow version; `space` "converter" so `latpred profile` labels it). The
committed fixtures are small variants of the same architectures (FIXTURE_SET); the corpus
itself is regenerated from here. latpred itself never depends on TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import tensorflow as tf
from tensorflow import keras

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "corpus"
A = keras.applications

# name -> (constructor, keyword arguments); weights=None everywhere (random init, seeded).
CORPUS: dict[str, tuple] = {}


def _add(name: str, fn, **kw) -> None:
    CORPUS[name] = (fn, kw)


for alpha, res in ((0.25, 128), (0.5, 160), (0.75, 192), (1.0, 224)):
    _add(f"mobilenet_v1_{alpha}_{res}", A.MobileNet, alpha=alpha, input_shape=(res, res, 3))
for alpha, res in ((0.35, 96), (0.35, 224), (0.5, 128), (0.75, 160), (1.0, 224), (1.3, 224),
                   (1.4, 224)):
    _add(f"mobilenet_v2_{alpha}_{res}", A.MobileNetV2, alpha=alpha, input_shape=(res, res, 3))
for alpha in (0.75, 1.0):
    for mini in (False, True):
        tag = "_minimalistic" if mini else ""
        _add(f"mobilenet_v3_small_{alpha}{tag}", A.MobileNetV3Small, alpha=alpha,
             minimalistic=mini, input_shape=(224, 224, 3), include_preprocessing=False)
        _add(f"mobilenet_v3_large_{alpha}{tag}", A.MobileNetV3Large, alpha=alpha,
             minimalistic=mini, input_shape=(224, 224, 3), include_preprocessing=False)
_add("mobilenet_v3_small_1.0_160", A.MobileNetV3Small, input_shape=(160, 160, 3),
     include_preprocessing=False)
for b, res in ((0, 224), (1, 240), (2, 260), (3, 300)):
    _add(f"efficientnet_b{b}", getattr(A, f"EfficientNetB{b}"), input_shape=(res, res, 3))
for b, res in ((0, 224), (1, 240), (2, 260), (3, 300)):
    _add(f"efficientnet_v2_b{b}", getattr(A, f"EfficientNetV2B{b}"), input_shape=(res, res, 3),
         include_preprocessing=False)
_add("densenet121", A.DenseNet121, input_shape=(224, 224, 3))
_add("densenet169", A.DenseNet169, input_shape=(224, 224, 3))
_add("nasnet_mobile", A.NASNetMobile, input_shape=(224, 224, 3))
_add("resnet50", A.ResNet50, input_shape=(224, 224, 3))
_add("resnet50_v2", A.ResNet50V2, input_shape=(224, 224, 3))
_add("resnet101", A.ResNet101, input_shape=(224, 224, 3))
_add("xception", A.Xception, input_shape=(299, 299, 3))
_add("inception_v3", A.InceptionV3, input_shape=(299, 299, 3))
_add("convnext_tiny", A.ConvNeXtTiny, input_shape=(224, 224, 3), include_preprocessing=False)
# Small resolutions of the same families: the corpus must hold models under 3 ms as well.
_add("mobilenet_v2_0.35_128", A.MobileNetV2, alpha=0.35, input_shape=(128, 128, 3))
_add("mobilenet_v3_small_0.75_128", A.MobileNetV3Small, alpha=0.75, input_shape=(128, 128, 3),
     include_preprocessing=False)
_add("mobilenet_v1_0.25_160", A.MobileNet, alpha=0.25, input_shape=(160, 160, 3))
_add("efficientnet_b0_128", A.EfficientNetB0, input_shape=(128, 128, 3))
_add("mobilenet_v1_0.5_128", A.MobileNet, alpha=0.5, input_shape=(128, 128, 3))
_add("mobilenet_v3_large_1.0_160", A.MobileNetV3Large, input_shape=(160, 160, 3),
     include_preprocessing=False)
_add("efficientnet_v2_b0_160", A.EfficientNetV2B0, input_shape=(160, 160, 3),
     include_preprocessing=False)
_add("densenet121_160", A.DenseNet121, input_shape=(160, 160, 3))
_add("resnet50_160", A.ResNet50, input_shape=(160, 160, 3))


# The committed fixtures (tests/fixtures/corpus): the same Keras architecture code at small
# width, resolution and class count, so the files stay under ~1 MB yet hold every idiom above
# (EfficientNet's constructor is keras.applications' own, with its width/depth coefficients).
def _efficientnet_tiny(**kw):
    from keras.src.applications import efficientnet

    return efficientnet.EfficientNet(0.25, 0.25, 96, 0.2, name="efficientnet_tiny", **kw)


def _convnext_tiny(**kw):
    from keras.src.applications import convnext

    return convnext.ConvNeXt([1, 1, 1, 1], [16, 32, 64, 128], default_size=64,
                             name="convnext_mini", **kw)


FIXTURE_SET: dict[str, tuple] = {
    "fx_convnext_mini_64": (_convnext_tiny, {"input_shape": (64, 64, 3), "classes": 10,
                                            "include_preprocessing": False}),
    "fx_mobilenet_v1_0.25_96": (A.MobileNet, {"alpha": 0.25, "input_shape": (96, 96, 3),
                                              "classes": 100}),
    "fx_mobilenet_v2_0.35_96": (A.MobileNetV2, {"alpha": 0.35, "input_shape": (96, 96, 3),
                                                "classes": 100}),
    "fx_mobilenet_v3_small_0.35_96": (A.MobileNetV3Small, {
        "alpha": 0.35, "input_shape": (96, 96, 3), "classes": 100,
        "include_preprocessing": False}),
    "fx_efficientnet_tiny_96": (_efficientnet_tiny, {"input_shape": (96, 96, 3),
                                                    "classes": 100}),
}


def _build(name: str) -> keras.Model:
    fn, kw = {**CORPUS, **FIXTURE_SET}[name]
    keras.utils.set_random_seed(0)
    try:
        return fn(weights=None, **kw)
    except TypeError:  # families without include_preprocessing
        kw = {k: v for k, v in kw.items() if k != "include_preprocessing"}
        return fn(weights=None, **kw)


def _facts(name: str, model: keras.Model) -> dict:
    def shape(t):
        return [d if d is not None else -1 for d in t.shape]

    return {"name": name, "space": "converter",
            "family": {**CORPUS, **FIXTURE_SET}[name][0].__name__,
            "converter": "TFLiteConverter.from_keras_model", "tensorflow": tf.__version__,
            "keras": keras.__version__, "inputs": [shape(t) for t in model.inputs],
            "outputs": [shape(t) for t in model.outputs], "params": int(model.count_params()),
            # The converter folds each batch norm's 4 vectors into its conv's bias (1 vector):
            # the file holds params - 3 * bn_channels weights (tests check exactly that).
            "bn_channels": sum(int(layer.gamma.shape[0] if layer.gamma is not None
                                   else layer.moving_mean.shape[0])
                               for layer in model.layers
                               if isinstance(layer, keras.layers.BatchNormalization))}


def convert(name: str) -> tuple[bytes, dict]:
    model = _build(name)
    data = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    return data, _facts(name, model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "out" / "corpus")
    ap.add_argument("--only", nargs="*", default=None, help="Names to make (default: all).")
    ap.add_argument("--fixtures", action="store_true",
                    help=f"The small variants of FIXTURE_SET, into {FIXTURES.relative_to(ROOT)}.")
    ap.add_argument("--list", action="store_true", help="Print the names and stop.")
    ap.add_argument("--refresh-facts", action="store_true",
                    help="Rewrite each existing model's .json without converting it again.")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(CORPUS))
        return 0
    out = FIXTURES if args.fixtures else args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(FIXTURE_SET if args.fixtures else CORPUS):
        if (out / f"{name}.tflite").exists():
            if args.refresh_facts:
                facts = _facts(name, _build(name))
                (out / f"{name}.json").write_text(json.dumps(facts, indent=1) + "\n")
            continue
        start = time.time()
        data, facts = convert(name)
        (out / f"{name}.tflite").write_bytes(data)
        (out / f"{name}.json").write_text(json.dumps(facts, indent=1) + "\n")
        print(f"{name}: {len(data) / 1e6:.1f} MB, {facts['params']:,} params, "
              f"{time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
