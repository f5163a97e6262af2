"""Fake inputs for the corpus programs whose data is easy to fake (INDEX.tsv's data column):
files in each program's own input format, written into a scratch copy of its converted tree,
and the command line that points the program at them. Pretrained weights are never selected; a
program that cannot train without them, or without a download, says so instead of a recipe.

Used by realworld.py's `trains` column. Nothing here edits a program.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class Trial:
    """How to run one converted program on fake data: its arguments, the folder it runs in
    (relative to the tree), the keras.datasets loaders faked from outside, and the extra
    import path (relative to the tree) its own launcher would set."""

    args: tuple[str, ...] = ()
    cwd: str = "."
    keras_datasets: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()


Recipe = Callable[[Path], Trial]


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _cifar10_binary(tree: Path) -> Trial:
    """The tutorial's CIFAR-10 binary batches: 1 label byte + 3072 image bytes per record; the
    tarball's name present, so that nothing is downloaded."""
    data = tree / "fake-data"
    batches = data / "cifar-10-batches-bin"
    batches.mkdir(parents=True)
    (data / "cifar-10-binary.tar.gz").touch()
    rng = _rng()
    for i in range(1, 6):
        labels = rng.integers(0, 10, (64, 1))
        images = rng.integers(0, 256, (64, 3072))
        np.concatenate([labels, images], axis=1).astype(np.uint8).tofile(
            batches / f"data_batch_{i}.bin"
        )
    return Trial(
        args=("--data_dir", str(data), "--train_dir", str(tree / "fake-train"), "--num_gpus", "2"),
        cwd="tutorials/image/cifar10",
    )


def _bilm_text(tree: Path) -> Trial:
    """bilm-tf: tokenized sentence shards and a vocabulary with its special tokens."""
    data = tree / "fake-data"
    data.mkdir()
    (tree / "fake-save").mkdir()  # the program writes its options there before training
    words = [f"w{i}" for i in range(40)]
    (data / "vocab.txt").write_text("\n".join(["<S>", "</S>", "<UNK>", *words]) + "\n")
    rng = _rng()
    for shard in range(2):
        lines = [" ".join(rng.choice(words, 12)) for _ in range(200)]
        (data / f"train.{shard}.txt").write_text("\n".join(lines) + "\n")
    return Trial(
        args=(
            "--train_prefix",
            str(data / "train.*.txt"),
            "--vocab_file",
            str(data / "vocab.txt"),
            "--save_dir",
            str(tree / "fake-save"),
        ),  # fmt: skip
        cwd="bin",
        python_path=(".",),
    )


def _gpt2_model(tree: Path) -> Trial:
    """gpt-2: a tiny model folder (hparams, a byte-level BPE of single characters) and a
    pre-encoded token file; no pretrained checkpoint (`--restore_from fresh`)."""
    model = tree / "models" / "tiny"
    model.mkdir(parents=True)
    # the program trains on windows of 1024 tokens: its position table must have 1024 rows
    hparams = {"n_vocab": 64, "n_ctx": 1024, "n_embd": 16, "n_head": 2, "n_layer": 2}
    (model / "hparams.json").write_text(json.dumps(hparams))
    (model / "encoder.json").write_text(json.dumps({chr(97 + i): i for i in range(26)}))
    (model / "vocab.bpe").write_text("#version: 0.2\n")
    tokens = _rng().integers(0, 26, 4000).astype(np.int32)
    np.savez(tree / "fake-tokens.npz", tokens)
    return Trial(
        args=(
            "--dataset",
            str(tree / "fake-tokens.npz"),
            "--model_name",
            "tiny",
            "--sample_length",
            "16",
            "--sample_every",
            "100000",
            "--save_every",
            "100000",
            "--restore_from",
            "fresh",
            "--batch_size",
            "2",
        ),  # fmt: skip
        python_path=("src",),
    )


def _c3d_frames(tree: Path) -> Trial:
    """C3D: folders of 16 JPEG frames listed with a label in list/train.list and
    list/test.list, and the 16-frame crop mean."""
    from PIL import Image

    rng = _rng()
    lines = []
    for clip in range(4):
        folder = tree / "fake-frames" / f"clip{clip}"
        folder.mkdir(parents=True)
        for frame in range(16):
            pixels = rng.integers(0, 256, (128, 171, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{frame:05d}.jpg")
        lines.append(f"{folder} {clip % 2}")
    (tree / "list").mkdir(exist_ok=True)
    for name in ("train.list", "test.list"):
        (tree / "list" / name).write_text("\n".join(lines) + "\n")
    np.save(tree / "crop_mean.npy", np.zeros((16, 112, 112, 3), np.float32))
    return Trial(args=("--batch_size", "1", "--max_steps", "3"))


def _bert_records(tree: Path) -> Trial:
    """BERT-GPU: a tiny bert_config.json and TFRecords of pretraining examples with the
    features its input_fn parses (sequence length 16, 4 masked positions)."""
    import tensorflow as tf

    seq, preds = 16, 4
    config = {
        "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 32,
        "type_vocab_size": 2, "initializer_range": 0.02,
    }  # fmt: skip
    (tree / "fake_bert_config.json").write_text(json.dumps(config))
    rng = _rng()

    def ints(values: np.ndarray) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    path = tree / "fake_pretraining.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(64):
            features = {
                "input_ids": ints(rng.integers(0, 64, seq)),
                "input_mask": ints(np.ones(seq, np.int64)),
                "segment_ids": ints(np.repeat([0, 1], seq // 2)),
                "masked_lm_positions": ints(rng.choice(seq, preds, replace=False)),
                "masked_lm_ids": ints(rng.integers(0, 64, preds)),
                "masked_lm_weights": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[1.0] * preds)
                ),
                "next_sentence_labels": ints(rng.integers(0, 2, 1)),
            }
            example = tf.train.Example(features=tf.train.Features(feature=features))
            writer.write(example.SerializeToString())
    return Trial(
        args=(
            "--bert_config_file", str(tree / "fake_bert_config.json"),
            "--input_file", str(path), "--output_dir", str(tree / "fake-output"),
            "--n_gpus", "2", "--train_batch_size", "4", "--max_seq_length", str(seq),
            "--max_predictions_per_seq", str(preds), "--num_train_steps", "10",
            "--num_warmup_steps", "1",
        ),  # fmt: skip
    )


def _mnist(tree: Path) -> Trial:
    return Trial(cwd="examples/tensorflow", keras_datasets=("mnist",))


def _keras_mnist(tree: Path) -> Trial:
    return Trial(cwd="examples/keras", keras_datasets=("mnist",))


def _kuza55_cifar10(tree: Path) -> Trial:
    return Trial(
        cwd="keras_tf_multigpu/examples/kuza55", keras_datasets=("cifar10",), python_path=(".",)
    )


# (repo, entry script) -> a recipe, or why the program cannot train here on fake data
RECIPES: dict[tuple[str, str], Recipe | str] = {
    ("horovod/horovod", "examples/tensorflow/tensorflow_mnist.py"): _mnist,
    ("horovod/horovod", "examples/keras/keras_mnist.py"): _keras_mnist,
    (
        "rossumai/keras-multi-gpu",
        "keras_tf_multigpu/examples/kuza55/cifar10_cnn_functional_multigpu.py",
    ): _kuza55_cifar10,
    ("tensorflow/models", "tutorials/image/cifar10/cifar10_multi_gpu_train.py"): _cifar10_binary,
    ("allenai/bilm-tf", "bin/train_elmo.py"): _bilm_text,
    ("nshepperd/gpt-2", "train-horovod.py"): _gpt2_model,
    ("hx173149/C3D-tensorflow", "train_c3d_ucf101.py"): _c3d_frames,
    ("guotong1988/BERT-GPU", "run_pretraining_gpu.py"): _bert_records,
    ("auroua/InsightFace_TF", "train_nets_mgpu.py"): "imports TensorLayer 1.x, which does not "
    "build on Python 3.11 (its setup needs distutils.msvccompiler)",
    ("xuannianz/EfficientDet", "train.py"): "imports utils.compute_overlap, a Cython extension "
    "the extracted repository does not hold",
    ("DetectionTeamUCAS/FPN_Tensorflow", "tools/multi_gpu_train.py"): "imports "
    "libs.box_utils.cython_utils, a Cython extension the extracted repository does not hold",
    (
        "rossumai/keras-multi-gpu",
        "keras_tf_multigpu/examples/benchmark_inception3_resnet50.py",
    ): "InceptionV3()/ResNet50() select ImageNet weights (downloaded) by default",
    ("experiencor/keras-yolo3", "train.py"): "needs the pretrained darknet weights backend.h5",
    ("openai/finetune-transformer-lm", "train.py"): "loads pretrained weights model/params_*.npy",
}
