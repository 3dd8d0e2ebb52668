"""The network: the 13-layer ConvNet ("conv-large") of Pi-model, Mean Teacher and the paper, with
weight normalization and mean-only batch normalization.

    from mtlc.train.model import ConvLarge
    z, logits = ConvLarge(num_classes=10, width=1.0)(images)

f(x) = h(g(x; theta_g); theta_h) (Section 3): z = g(x; theta_g) is the globally average-pooled
feature on which the LC loss acts (Eq. 4-5), logits = h(z; theta_h) the class scores.
"""
import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError

# The input side it is pooled to 1 x 1 from needs: two 2x2 poolings, then a 3x3 convolution without padding.
MIN_IMAGE_SIZE = 16


@dataclass
class ModelConfig:
    """What builds the network: a checkpoint keeps it apart from the run's settings ("model_args").
    backbone: "convlarge" (this file's network, trained from scratch), or a pretrained trunk's name
    (pretrained.py: its trunk and a head of `width` x 256 units). trunk: "frozen" (the head trains on
    the trunk's kept features) or "trained" (the whole network trains on images that it resizes to
    image_size, the side its trunk sees)."""
    num_classes: int = 10
    width: float = 1.0
    bn_momentum: float = 0.001
    backbone: str = "convlarge"
    trunk: str = "frozen"
    image_size: Optional[int] = None
    head: str = "mlp"  # a pretrained trunk's head: mlp, or linear (fitted; pretrained.HEADS)

    @classmethod
    def of_run(cls, config):
        from .objectives import OBJECTIVES
        trained = config.trunk == "trained"
        return cls(config.num_classes, config.width, config.bn_momentum, config.backbone, config.trunk,
                   config.image_size if trained else None, OBJECTIVES[config.consistency].head)

    @property
    def keeps_features(self):
        """Whether the network is a head on a frozen trunk, trained on the trunk's kept features."""
        return self.backbone != "convlarge" and self.trunk == "frozen"

    def as_dict(self):
        """What a checkpoint keeps; the paper's network's without a backbone key and a frozen trunk's
        without trunk keys, as they always were."""
        values = dataclasses.asdict(self)
        if values["head"] == "mlp":
            del values["head"]
        if values["trunk"] == "frozen":
            del values["trunk"], values["image_size"]
        if values["backbone"] == "convlarge":
            del values["backbone"]
        return values


def check_image_size(size):
    if size < MIN_IMAGE_SIZE:
        raise UserError(f"--image-size {size} is too small: the network pools twice and has a 3x3 convolution "
                        f"without padding after that ({MIN_IMAGE_SIZE} or more)")


class WeightNormMeanOnlyBN(nn.Module):
    """Conv or linear layer, weight-normalized, followed by mean-only batch normalization
    (Salimans & Kingma 2016): y = W x - mean(W x) + b with W = g v / |v| per output unit.

    `data_init` (on the first batch) sets g so that W x has standard deviation `init_scale` on that
    batch, and, as the authors' code does, b = -mean(W x): the units start shifted by their initial
    mean, mostly on the 0.1 slope of the LeakyReLU that follows. With b = 0 instead, SGD at the
    paper's lr 0.05 with momentum 0.9 diverged within 10 steps here. Training subtracts the batch
    mean and updates a running mean (momentum 0.001), which starts at the first batch's mean;
    eval mode subtracts the running mean.
    """

    def __init__(self, in_features, out_features, kernel_size=None, padding=0, init_scale=1.0,
                 v_std=0.05, momentum=0.001):
        super().__init__()
        shape = (out_features, in_features) + ((kernel_size, kernel_size) if kernel_size else ())
        self.v = nn.Parameter(torch.randn(shape) * v_std)
        self.g = nn.Parameter(torch.ones(out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.register_buffer("running_mean", torch.zeros(out_features))
        self.is_conv, self.padding = kernel_size is not None, padding
        self.init_scale, self.momentum = init_scale, momentum
        self.pending_init = False

    def _project(self, x, weight):
        if self.is_conv:
            return F.conv2d(x, weight, padding=self.padding)
        return F.linear(x, weight)

    def _weight(self):
        norm = self.v.flatten(1).norm(dim=1).view(-1, *[1] * (self.v.dim() - 1))
        return self.g.view_as(norm) * self.v / norm

    def forward(self, x):
        if self.pending_init:
            self._data_init(x)
        t = self._project(x, self._weight())
        dims = (0, 2, 3) if self.is_conv else (0,)
        shape = (1, -1, 1, 1) if self.is_conv else (1, -1)
        if self.training:
            mean = t.mean(dims)
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach().float(), self.momentum)
        else:
            mean = self.running_mean.to(t.dtype)
        return t + (self.bias - mean).to(t.dtype).view(shape)  # one pass over t; t's dtype under autocast

    @torch.no_grad()
    def _data_init(self, x):
        self.pending_init = False
        t = self._project(x, self._weight() / self.g.view(-1, *[1] * (self.v.dim() - 1)))
        dims = (0, 2, 3) if self.is_conv else (0,)
        self.g.copy_(self.init_scale / (t.std(dims) + 1e-8))
        self.running_mean.copy_(t.mean(dims) * self.g)
        self.bias.copy_(-self.running_mean)


class Dropout(nn.Module):
    """Dropout (zero with probability p, scale the rest by 1 / (1 - p)). On a CPU the mask comes
    from rand_like: nn.Dropout's bernoulli_ took 16% of a training step at width 0.125, this 4x less.
    On a GPU nn.functional.dropout is one fused kernel already."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        if x.is_cuda:
            return F.dropout(x, self.p, training=True)
        mask = torch.rand_like(x, dtype=torch.float32).ge_(self.p).mul_(1.0 / (1.0 - self.p))
        return x * mask.to(x.dtype)


class ConvLarge(nn.Module):
    """The 13-layer ConvNet of Pi-model, Mean Teacher and the paper (3,121,812 parameters at width 1).

    forward(x) returns (z, logits): z is the globally average-pooled feature (128-d at width 1)
    on which the LC loss acts, logits the 10 (num_classes) class scores.
    """

    def __init__(self, num_classes=10, width=1.0, bn_momentum=0.001):
        super().__init__()
        def channels(c):  # width-1 channel count -> this network's (the RGB input stays 3)
            return c if c == 3 else max(1, round(c * width))

        def layer(cin, cout, k=None, pad=0, init_scale=1.0):
            # v ~ N(0, 0.05^2) at width 1, the authors' init. SGD's step on a weight direction
            # scales as 1 / |v|^2, so a narrower layer keeps the full-width row norm |v| instead:
            # otherwise its effective lr grows as 1 / width and training diverges.
            v_std = 0.05 * math.sqrt(cin / channels(cin))
            return WeightNormMeanOnlyBN(channels(cin), channels(cout), k, pad, init_scale, v_std, bn_momentum)

        specs = [(3, 128, 3, 1), (128, 128, 3, 1), (128, 128, 3, 1), "pool",
                 (128, 256, 3, 1), (256, 256, 3, 1), (256, 256, 3, 1), "pool",
                 (256, 512, 3, 0), (512, 256, 1, 0), (256, 128, 1, 0)]
        layers = []
        for spec in specs:
            if spec == "pool":
                layers += [nn.MaxPool2d(2), Dropout(0.5)]
            else:
                layers += [layer(*spec), nn.LeakyReLU(0.1, inplace=True)]
        self.features = nn.Sequential(*layers)
        self.feature_dim = channels(128)
        self.classifier = WeightNormMeanOnlyBN(self.feature_dim, num_classes, init_scale=0.1,
                                               v_std=0.05 * math.sqrt(128 / self.feature_dim), momentum=bn_momentum)

    def forward(self, x):
        z = self.features(x).mean((2, 3))
        return z, self.classifier(z)

    @torch.no_grad()
    def data_init(self, x):
        """Data-dependent initialization of every layer from one batch (train mode, as in training)."""
        for m in self.modules():
            if isinstance(m, WeightNormMeanOnlyBN):
                m.pending_init = True
        was_training = self.training
        self.train()
        self(x)
        self.train(was_training)


class SplitForward(nn.Module):
    """The authors' forward of a training batch: its first n_labeled images and the rest through the
    model in two passes, each with its own BN batch means (and running-mean update); one output."""

    def __init__(self, model, n_labeled):
        super().__init__()
        self.model, self.n_labeled = model, n_labeled

    def forward(self, x):
        parts = self.model(x[:self.n_labeled]), self.model(x[self.n_labeled:])
        return tuple(torch.cat(outputs) for outputs in zip(*parts))


@torch.no_grad()
def recompute_bn_means(model, batches):
    """Set every BN running mean to the average, over the images of `batches`, of the batch means its
    layer sees in training mode with dropout off: eval mode then matches the weights as they are, however far a
    slow momentum (the paper's 0.001) lags behind them (the idea of fvcore's PreciseBN); a trained
    pretrained trunk's batch norms (torch's) their running means and variances alike. The model's
    mode and momenta are restored; its weights are not touched."""
    layers = [m for m in model.modules() if isinstance(m, (WeightNormMeanOnlyBN, nn.modules.batchnorm._BatchNorm))]
    momenta = [m.momentum for m in layers]
    was_training = model.training
    model.train()
    for m in model.modules():
        if isinstance(m, Dropout):
            m.eval()
    seen = 0
    for x in batches:
        seen += len(x)
        for m in layers:
            m.momentum = len(x) / seen  # running mean <- the mean over the images seen so far
        model(x)
    for m, momentum in zip(layers, momenta):
        m.momentum = momentum
    model.train(was_training)
