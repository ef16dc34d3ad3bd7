"""Ultralytics YOLO models of the real-world suite, built from the package's own yaml files (random weights) and
prepared for export the way ultralytics' own pnnx/ncnn exporter prepares them: conv+BN fused, the head in export
mode (decoded boxes, no tuple of raw maps), C2f's split forward."""

from __future__ import annotations

from _realworld_spec import Dynamic, Feed, Spec
from torch import nn
from ultralytics.nn.modules import C2f, Classify, Detect
from ultralytics.nn.tasks import ClassificationModel, DetectionModel, PoseModel, SegmentationModel, yaml_model_load

# Depth and width multipliers below the smallest official scale ("n" is [0.33, 0.25, 1024]): every block and head
# is kept, with 8 to 16 channels in the backbone and neck. The box branch is 4 x reg_max wide at any scale: 8 DFL
# bins instead of 16 make it 32. Detection and segmentation get 10 classes (the class branch is 80 wide for 80).
SCALE = [0.33, 0.0625, 256]
REG_MAX = 8
IMG = 64


def _load(cfg: str, model_cls: type, **kwargs) -> nn.Module:
    d = yaml_model_load(cfg)
    d["scales"], d["scale"], d["reg_max"] = {"n": SCALE}, "n", REG_MAX
    model = model_cls(d, ch=3, verbose=False, **kwargs).eval()
    model = model.fuse(verbose=False)
    for m in model.modules():
        if isinstance(m, Detect):  # Segment and Pose are Detect subclasses
            m.export, m.format, m.dynamic = True, "ncnn", False
        elif isinstance(m, Classify):
            m.export, m.format = True, "ncnn"
        elif isinstance(m, C2f):
            m.forward = m.forward_split
    for p in model.parameters():
        p.requires_grad = False
    return model


def _builder(cfg: str, model_cls: type, **kwargs):
    return lambda: _load(cfg, model_cls, **kwargs)


def _dynamic_image() -> Dynamic:
    # A larger max image, a smaller second export shape, then shapes in between (multiples of the stride 32).
    return Dynamic(
        max_shapes=[(2, 3, 96, 96)],
        inputshape2=[(1, 3, 64, 64)],
        cases=[[(2, 3, 96, 96)], [(1, 3, 64, 64)], [(1, 3, 64, 96)], [(2, 3, 32, 64)]],
        what="batch, image size",
    )


def _spec(name: str, arch: str, build, dynamic: Dynamic | None = None) -> Spec:
    return Spec(name, "yolo", arch, build, [Feed("images", (1, 3, IMG, IMG))], dynamic=dynamic)


SPECS = [
    _spec("yolov8_detect", "ultralytics yolov8.yaml at width 0.0625: C2f, SPPF, decoupled head with DFL decode",
          _builder("yolov8n.yaml", DetectionModel, nc=10), _dynamic_image()),
    _spec("yolov8_segment", "ultralytics yolov8-seg.yaml at width 0.0625: detect head + mask coefficients + proto",
          _builder("yolov8n-seg.yaml", SegmentationModel, nc=10)),
    _spec("yolov8_pose", "ultralytics yolov8-pose.yaml at width 0.0625: detect head + 17 keypoints decode",
          _builder("yolov8n-pose.yaml", PoseModel)),
    _spec("yolov8_classify", "ultralytics yolov8-cls.yaml at width 0.0625: backbone + Classify (softmax)",
          _builder("yolov8n-cls.yaml", ClassificationModel, nc=10)),
    _spec("yolo11_detect", "ultralytics yolo11.yaml at width 0.0625: C3k2, C2PSA attention, detect head",
          _builder("yolo11n.yaml", DetectionModel, nc=10), _dynamic_image()),
    _spec("yolo11_segment", "ultralytics yolo11-seg.yaml at width 0.0625",
          _builder("yolo11n-seg.yaml", SegmentationModel, nc=10)),
    _spec("yolo11_pose", "ultralytics yolo11-pose.yaml at width 0.0625", _builder("yolo11n-pose.yaml", PoseModel)),
]
