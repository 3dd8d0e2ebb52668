"""The networks a run trains: the paper's ConvLarge from scratch (model.py), or a head on a pretrained
trunk, frozen or trained with it (pretrained.py), as a run's ModelConfig says."""
from .model import ConvLarge
from .pretrained import PretrainedNet


def build_models(model_config, device, package_weights=True):
    """A student and its teacher (no gradients), as a ModelConfig sets them. package_weights: a trained
    trunk starts from its package's weights (a new run); False where a checkpoint's weights come next."""
    c = model_config
    if c.backbone == "convlarge":
        student, teacher = (ConvLarge(c.num_classes, c.width, c.bn_momentum).to(device) for _ in range(2))
    else:
        trained_size = c.image_size if c.trunk == "trained" else None
        student, teacher = (PretrainedNet(c.backbone, c.num_classes, c.width, c.bn_momentum, trained_size,
                                          package_weights, c.head).to(device) for _ in range(2))
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher
