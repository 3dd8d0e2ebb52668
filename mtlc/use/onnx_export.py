"""A checkpoint's classifier as ONNX (`evaluate.py --onnx model.onnx`), for an app or a service that
has neither torch nor this package: the graph takes uint8 images (N, 3, H, W) at the checkpoint's
image size, framed as training framed them (the metadata's "framing": data/framing.py's squash,
crop or pad), any N, and returns calibrated class probabilities (N, classes): the normalization of
training and the calibration's temperature are inside it. The class names, the framing, the
temperature and what it came from are in the model's metadata (`onnxruntime.InferenceSession(...).get_modelmeta()
.custom_metadata_map`).
"""
import copy
import json

import torch

from ..disk.runs import atomic_write
from ..errors import UserError

INPUT, OUTPUT = "images", "probabilities"
OPSET = 18


class CalibratedProbabilities(torch.nn.Module):
    """uint8 images -> softmax(logits / T) of a network in eval mode, normalized as in training, each
    probability at most the ceiling the held-out images support (calibration.supported_confidence)."""

    def __init__(self, model, mean, std, temperature, ceiling):
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.float().view(1, -1, 1, 1))
        self.register_buffer("std", std.float().view(1, -1, 1, 1))
        self.register_buffer("inverse_temperature", torch.tensor(1.0 / temperature, dtype=torch.float32))
        self.ceiling = float(ceiling)

    def forward(self, images):
        x = (images.float() / 255.0 - self.mean) / self.std
        _, logits = self.model(x)
        return torch.softmax(logits.float() * self.inverse_temperature, dim=1).clamp(max=self.ceiling)


def metadata(classifier, checkpoint):
    """The model's metadata: what a user of the file needs besides the graph."""
    config = classifier.config
    return {"classes": json.dumps(classifier.classes), "image_size": str(classifier.image_size),
            "input": f"{INPUT}: uint8 (N, 3, {classifier.image_size}, {classifier.image_size}), RGB, each image "
                     f"{classifier.framing.describe()}",
            "framing": json.dumps(classifier.framing.as_dict()),
            "output": f"{OUTPUT}: float32 (N, {len(classifier.classes)}), calibrated, in the order of classes",
            "temperature": repr(classifier.temperature), "confidence_ceiling": repr(classifier.ceiling),
            "calibration": "temperature scaling on the checkpoint's held-out images" if classifier.calibration
            else f"none ({classifier.uncalibrated}): the raw softmax",
            "model": classifier.model_name, "answers": classifier.answers, "checkpoint": str(checkpoint),
            "dataset": str(config.dataset),
            "stage": str(classifier.state.get("stage")), "producer": "mtlc (MT+LC)"}


def export_onnx(classifier, path, checkpoint=""):
    """Write the classifier (mtlc.use.classifier.Classifier: its model, normalization and temperature) to
    `path` as an ONNX model with a dynamic batch size and metadata(); returns the metadata."""
    try:
        import onnx
        import onnxscript  # noqa: F401  torch's exporter needs it
    except ImportError:
        raise UserError("--onnx needs the onnx and onnxscript packages: pip install onnx onnxscript") from None
    module = CalibratedProbabilities(copy.deepcopy(classifier.model).cpu(), classifier.mean.cpu(),
                                     classifier.std.cpu(), classifier.temperature, classifier.ceiling).eval()
    size = classifier.image_size
    example = torch.zeros(2, 3, size, size, dtype=torch.uint8)
    with torch.no_grad():
        program = torch.onnx.export(module, (example,), input_names=[INPUT], output_names=[OUTPUT],
                                    dynamic_shapes={"images": {0: torch.export.Dim("batch")}}, opset_version=OPSET,
                                    external_data=False, dynamo=True, verbose=False)
    model = program.model_proto
    meta = metadata(classifier, checkpoint)
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    atomic_write(path, lambda f: f.write(data))
    return meta
